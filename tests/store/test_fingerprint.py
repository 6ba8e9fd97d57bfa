"""What a call ran with: the call-shaping settings without secrets, and a hash that changes with them.
And the overview's percentiles, which must agree with numpy's."""

from __future__ import annotations

import json

import numpy as np

from app.settings import Settings
from app.store import call_settings, fingerprint
from app.store.overview import percentile


def test_call_settings_keep_models_and_precision_and_leave_secrets_out() -> None:
    settings = Settings.model_validate({"llm": {"api_key": "sk-very-secret", "model": "qwen2.5-0.5b"},
                                        "twilio": {"auth_token": "also-secret"}})
    kept = call_settings(settings)
    assert kept["llm"]["model"] == "qwen2.5-0.5b" and kept["asr"]["compute_type"] == "int8"
    assert kept["llm"]["speculative"]["method"] == settings.llm.speculative.method
    text = json.dumps(kept)
    assert "secret" not in text and "twilio" not in kept and "api_key" not in kept["llm"]
    assert "system_prompt" not in kept["session"] and len(kept["session"]["system_prompt_sha256"]) == 16


def test_the_fingerprint_follows_the_settings() -> None:
    base = call_settings(Settings())
    assert fingerprint(base) == fingerprint(call_settings(Settings())) and len(fingerprint(base)) == 16
    other = call_settings(Settings.model_validate({"llm": {"temperature": 0.1}}))
    assert fingerprint(other) != fingerprint(base)
    prompt = call_settings(Settings.model_validate({"session": {"system_prompt": "Be brief."}}))
    assert fingerprint(prompt) != fingerprint(base)


def test_percentiles_agree_with_numpy() -> None:
    values = [float(v) for v in np.random.default_rng(3).gamma(4.0, 80.0, size=101)]
    for q in (0, 50, 95, 99, 100):
        assert percentile(values, q) == round(float(np.percentile(values, q)), 1)
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0
