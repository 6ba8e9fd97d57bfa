"""Call QA: every call and turn kept (SQLite or PostgreSQL), call recordings, and the optional trace
export. The rest of the service uses only what is named here; see store.py for the hook points."""

from app.store.config import OtelConfig, StorageConfig
from app.store.fingerprint import call_settings, fingerprint
from app.store.queries import CallFilter, CallPage
from app.store.recording import CallRecorder
from app.store.records import CallRecord, CallTimeline, TurnRecord, spec_from_stats, utc_now
from app.store.store import CallStore

__all__ = ["CallFilter", "CallPage", "CallRecord", "CallRecorder", "CallStore", "CallTimeline", "OtelConfig",
           "StorageConfig", "TurnRecord", "call_settings", "fingerprint", "spec_from_stats", "utc_now"]
