"""SIP calls: trunks and PBXs in and out (docs/sip.md)."""
