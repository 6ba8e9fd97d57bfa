"""Coqui XTTS-v2 (package coqui-tts, import name TTS), streaming, for GPU deployments.

Optional: install the extra (`pip install 'voice-agent[coqui]'`) and a torchaudio that matches
torch. It cannot run on the CPU development machines (see shared MODELS.md: no torchaudio build
loads against torch 2.13 there, and no XTTS weights ship in a registry package).

Follows the library's documented streaming use:

    config = XttsConfig(); config.load_json(".../config.json")
    model = Xtts.init_from_config(config); model.load_checkpoint(config, checkpoint_dir=...)
    gpt_cond_latent, speaker_embedding = model.get_conditioning_latents(audio_path=[speaker_wav])
    for chunk in model.inference_stream(text, "en", gpt_cond_latent, speaker_embedding): ...
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from core.errors import BackendUnavailableError, EngineError, ModelMissingError
from models.config import TtsConfig
from models.protocols import Audio

log = logging.getLogger(__name__)
INSTALL = ("install the coqui extra for GPU deployments: pip install 'voice-agent[coqui]' "
           "(coqui-tts, plus a torchaudio built for the installed torch)")


class CoquiXttsSynthesizer:
    name = "coqui-xtts"
    sample_rate = 24000

    def __init__(self, config: TtsConfig) -> None:
        try:
            import torch
            from TTS.tts.configs.xtts_config import XttsConfig
            from TTS.tts.models.xtts import Xtts
        except (ImportError, OSError, RuntimeError) as exc:  # torchaudio mismatches fail as OSError/RuntimeError
            raise BackendUnavailableError(f"Coqui XTTS cannot be imported ({exc}); {INSTALL}") from exc
        self.config = config
        model_dir = _model_dir(config.coqui_model)
        xtts_config = XttsConfig()
        xtts_config.load_json(os.path.join(model_dir, "config.json"))
        model = Xtts.init_from_config(xtts_config)
        model.load_checkpoint(xtts_config, checkpoint_dir=model_dir, use_deepspeed=False)
        device = config.coqui_device
        if device == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailableError("Coqui XTTS is set to run on CUDA (tts.coqui_device) but no GPU is visible")
        self.model: Any = model.to(device)
        self.sample_rate = int(getattr(xtts_config.audio, "output_sample_rate", 24000))
        self.latent, self.embedding = self._speaker(config)
        log.info("TTS: Coqui XTTS-v2 from %s on %s", model_dir, device)

    def _speaker(self, config: TtsConfig) -> tuple[Any, Any]:
        if config.coqui_speaker_wav:
            if not os.path.isfile(config.coqui_speaker_wav):
                raise ModelMissingError(f"the XTTS speaker clip {config.coqui_speaker_wav!r} does not exist")
            latent, embedding = self.model.get_conditioning_latents(audio_path=[config.coqui_speaker_wav])
            return latent, embedding
        speakers = getattr(getattr(self.model, "speaker_manager", None), "speakers", None) or {}
        name = config.voice or next(iter(speakers), "")
        if name not in speakers:
            raise BackendUnavailableError(
                "Coqui XTTS needs a voice: set tts.coqui_speaker_wav to a reference clip, or tts.voice to one "
                f"of the model's speakers ({', '.join(list(speakers)[:5]) or 'none found'})")
        entry = speakers[name]
        return entry["gpt_cond_latent"], entry["speaker_embedding"]

    def synthesize(self, text: str) -> Iterator[Audio]:
        try:
            chunks = self.model.inference_stream(
                text, self.config.coqui_language, self.latent, self.embedding,
                speed=self.config.speed, enable_text_splitting=False,
            )
            for chunk in chunks:
                yield np.asarray(chunk.squeeze().float().cpu().numpy(), dtype=np.float32)
        except RuntimeError as exc:
            raise EngineError(f"Coqui XTTS failed on {text[:40]!r}: {exc}") from exc


def _model_dir(ref: str) -> str:
    """A local folder with config.json and the checkpoint, or a Coqui model name to download."""
    if os.path.isdir(ref):
        return ref
    try:
        from TTS.utils.manage import ModelManager

        model_path, _, _ = ModelManager().download_model(ref)
    except Exception as exc:
        raise ModelMissingError(f"cannot get the Coqui model {ref!r} ({exc}); put it in a folder and set "
                                "tts.coqui_model to that folder") from exc
    return model_path if os.path.isdir(model_path) else os.path.dirname(model_path)
