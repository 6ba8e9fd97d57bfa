"""Speech models: voice activity (Silero), recognition (faster-whisper), end of turn (Smart Turn)
and synthesis (hibari, eSpeak NG, Coqui XTTS-v2)."""
