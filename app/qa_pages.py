"""The call QA dashboard's pages (docs/qa.md, "Dashboard"): `/qa`, the calls list with the overview
charts, and `/qa/calls/{id}`, one call turn by turn. Both are static HTML under app/static/qa/ whose
scripts read the QA API (app/qa_api.py); the call page takes the id from its own path."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

PAGES = Path(__file__).parent / "static" / "qa"
router = APIRouter(prefix="/qa", include_in_schema=False)


@router.get("")
async def calls_page() -> FileResponse:
    return FileResponse(PAGES / "list.html")


@router.get("/calls/{call_id}")
async def call_page(call_id: str) -> FileResponse:
    """Any id: the page asks the API for it and says so when there is no such call."""
    return FileResponse(PAGES / "call.html")
