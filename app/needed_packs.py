"""The model packs a service with these settings loads, so the images fetch them before serving
(docker/entrypoint.sh): the ASR model, the end-of-turn model when one is used, and with the
embedded engine the LLM, the LLM of calls with tools, and the draft model when it drafts. Hugging
Face ids and local paths are not packs and are left out."""

from __future__ import annotations

from app.settings import Settings
from models.packs.catalog import pack_named


def needed_packs(settings: Settings) -> list[str]:
    refs = [settings.asr.model]
    if settings.turn.engine == "smart-turn":
        refs.append(settings.turn.model)
    llm = settings.llm
    if llm.engine == "embedded":
        refs += [llm.model, llm.tools_model]
        if llm.speculative.method == "draft_model":
            refs.append(llm.speculative.draft_model)
    packs = [pack_named(ref) for ref in refs if ref]
    return list(dict.fromkeys(pack.name for pack in packs if pack is not None))
