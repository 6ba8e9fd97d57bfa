"""The call QA dashboard's files: the vendored Chart.js is the pinned one, the pages are served and
load nothing from elsewhere (the service works offline), and every static file ships in the package.
The pages themselves are driven in Chromium by tests/e2e/test_qa_dashboard.py."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from pipeline.session import Backends
from tests.pipeline.fakes import FakeLLM, FakeRecognizer, FakeSynthesizer, FakeVad

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "app" / "static"
VENDOR = STATIC / "vendor"
PAGES = {"/qa": "list.html", "/qa/calls/some-call-id": "call.html"}


def test_the_vendored_chart_js_is_the_pinned_one() -> None:
    manifest = json.loads((VENDOR / "manifest.json").read_text())
    assert set(manifest) == {"chart.umd.js"}  # every vendored file is pinned; and only what is there
    pin = manifest["chart.umd.js"]
    data = (VENDOR / "chart.umd.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == pin["sha256"]
    assert data.startswith(b"/*!\n * Chart.js v" + pin["version"].encode() + b"\n")
    assert pin["package"] == "chart.js" and pin["license"] == "MIT"
    assert "MIT License" in (VENDOR / pin["license_file"]).read_text()
    assert re.fullmatch(r"sha512-[A-Za-z0-9+/]{86}==", pin["npm_integrity"])


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [value for name, value in attrs if name in ("src", "href") and value]


@pytest.fixture(scope="module")
def client() -> TestClient:
    backends = Backends(FakeVad(), FakeRecognizer([]), FakeSynthesizer(), FakeLLM([]))
    # no lifespan: no store is opened
    return TestClient(create_app(Settings(), backends=backends), base_url="http://127.0.0.1")


@pytest.mark.parametrize("path", sorted(PAGES))
def test_a_page_loads_only_the_services_own_files(client: TestClient, path: str) -> None:
    response = client.get(path)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert response.text == (STATIC / "qa" / PAGES[path]).read_text()
    links = _Links()
    links.feed(response.text)
    assert any(url.endswith("vendor/chart.umd.js") for url in links.urls)
    for url in links.urls:
        if url.startswith("data:"):
            continue
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{path}: {url} is not the service's own"
        # relative (so a path prefix in front of the service keeps working) and served
        assert not url.startswith("/"), url
        target = urlsplit(urljoin("http://testserver" + path, url)).path
        assert client.get(target).status_code == 200, (path, url, target)


def test_the_pages_scripts_and_styles_fetch_nothing_from_elsewhere() -> None:
    for source in sorted((STATIC / "qa").iterdir()):
        text = source.read_text()
        assert not re.search(r"\b(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.IGNORECASE), source.name
        if source.suffix == ".js":
            imports = re.findall(r"""^import\b[^;]*?from\s+["']([^"']+)["']""", text, re.MULTILINE)
            assert all(name.startswith("./") for name in imports), (source.name, imports)


def test_every_static_file_ships_in_the_package() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app"]
    shipped = {path for pattern in patterns for path in (ROOT / "app").glob(pattern) if path.is_file()}
    assert {path for path in STATIC.rglob("*") if path.is_file()} <= shipped
