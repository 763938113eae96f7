"""The trajectory viewer: colours by hand, then the real server on 127.0.0.1 read by a real headless
Chromium (Debian's `chromium`; `make test` installs it): the DOM it rendered, a screenshot that is not
blank, model text escaped, and the API key."""

from __future__ import annotations

import math
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from trajectory_testlib import CharDecoder, small_trial

from rollflow.api.errors import ViewerInputError
from rollflow.viewer import html as H
from rollflow.viewer.browser import find_chromium, render
from rollflow.viewer.pages import Pages, static_report
from rollflow.viewer.server import ViewerServer
from rollflow.viewer.trajectory_filter import TrajectoryFilter
from storage.fs import Storage
from storage.query import TrajectoryQuery

SCRIPT = "<script>alert(1)</script>"


def _browser() -> None:
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium: `make browser` (apt-get install -y chromium) must run before the tests")
        pytest.skip("no chromium here: `apt-get install -y chromium` (make browser)")


def test_colours_and_escaping_by_hand() -> None:
    # versions 10..20: v15 is the middle, hue 240 - 240 * 0.5 = 120; prompt tokens are grey
    assert H.version_colour(15, 10, 20) == "hsl(120, 75%, 82%)"
    assert H.version_colour(10, 10, 20) == "hsl(240, 75%, 82%)"
    assert H.version_colour(-1, 10, 20) == H.PROMPT_GREY
    # p = 0.5 -> hue 60 (yellow); p = 1 -> 120 (green)
    assert H.logprob_colour(math.log(0.5)) == "hsl(60, 70%, 80%)"
    assert H.logprob_colour(0.0) == "hsl(120, 70%, 80%)"
    strip = H.token_strip([H.Token(SCRIPT, 60, 3, -0.1, True)], by="version", vmin=0, vmax=3)
    assert "<script" not in strip and "&lt;script&gt;alert(1)&lt;/script&gt;" in strip


def test_filter_parsing() -> None:
    f = TrajectoryFilter.from_params({"version": "3:7", "min_reward": "0.5", "finish": "length"})
    assert (f.min_version, f.max_version, f.min_reward, f.finish) == (3, 7, 0.5, "length")
    assert TrajectoryFilter.from_params({"version": "4"}).max_version == 4
    cond, args = f.where(can_decode=False)
    assert args == [3, 7, 0.5, "length"] and cond.count("?") == 4
    for bad in ({"version": "x"}, {"min_reward": "nan"}, {"limit": "0"}, {"offset": "-1"}):
        with pytest.raises(ViewerInputError):
            TrajectoryFilter.from_params(bad)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[ViewerServer, Storage]]:
    storage = Storage.open(str(tmp_path / "store"), "exp", "trial")
    small_trial(storage)
    decoder = CharDecoder()
    pages = Pages(TrajectoryQuery(storage, decode=decoder.decode), decoder, title="exp / trial")
    server = ViewerServer(pages, api_key=None)
    server.start()
    yield server, storage
    server.shutdown()
    server.server_close()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: object, **k: object) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {})) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def test_pages_in_headless_chromium(served: tuple[ViewerServer, Storage], tmp_path: Path) -> None:
    _browser()
    server, _ = served
    assert server.server_address[0] == "127.0.0.1"
    dom = render(server.url)
    assert "The run at a glance" in dom and "2 versions (v0..v1), 3 groups, 6 trajectories" in dom
    assert "<svg" in dom and "length 2" in dom  # the charts, and v1's finish reasons
    # one trajectory: the script answer's tokens are text in the DOM, never an element
    dom = render(server.url + "trajectory?id=g2-1")
    assert "Tokens by policy version" in dom and "<script" not in dom
    assert ">&lt;</span>" in dom and 'title="id 60 | v1 | logprob -0.500"' in dom  # '<' made by v1
    shot = tmp_path / "overview.png"
    render(server.url, screenshot=shot, size=(1000, 700))
    from PIL import Image

    img = Image.open(shot).convert("RGB")
    assert img.size == (1000, 700)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, charts and table: not a blank page
    dark = sum(n for n, (r, g, b) in colours if r + g + b < 300)
    assert dark > 2000  # enough dark pixels to be text


def test_filters_and_prompt_page(served: tuple[ViewerServer, Storage]) -> None:
    """The pages carry no script, so the served HTML is what the browser shows (checked above)."""
    server, _ = served
    status, body, _ = _get(server.url + "trajectories?finish=length")
    assert status == 200 and "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script" not in body
    assert "g2-0" in body and "g0-" not in body  # only g2's rows were cut at 'length'
    body = _get(server.url + "trajectories?prompt=2%2B2")[1]  # a substring of the decoded prompt
    assert "g1-0" in body and "g2-" not in body
    body = _get(server.url + "trajectories?version=1&max_reward=0")[1]
    assert "g2-1" in body and "g0-" not in body
    body = _get(server.url + "prompt?id=p-same")[1]
    assert "v0: reward mean 0.500, 2 answers" in body and "v1: reward mean 0.000, 2 answers" in body


def test_errors_and_headers(served: tuple[ViewerServer, Storage]) -> None:
    server, _ = served
    status, body, headers = _get(server.url + "trajectories?version=x")
    assert status == 400 and "version=&#x27;x&#x27;" in body
    assert (
        "script-src" not in headers["Content-Security-Policy"]
        and "default-src 'none'" in headers["Content-Security-Policy"]
    )
    assert _get(server.url + "trajectory?id=nope")[0] == 404
    assert _get(server.url + "etc/passwd")[0] == 404


def test_api_key(tmp_path: Path) -> None:
    storage = Storage.open(str(tmp_path / "store"), "exp", "trial")
    small_trial(storage)
    with pytest.raises(ViewerInputError, match="without an API key"):
        ViewerServer(Pages(TrajectoryQuery(storage), title="t"), host="0.0.0.0")
    server = ViewerServer(Pages(TrajectoryQuery(storage), title="t"), api_key="s3cret-key")
    server.start()
    try:
        assert _get(server.url)[0] == 401
        assert _get(server.url, {"Authorization": "Bearer wrong"})[0] == 401
        assert _get(server.url, {"Authorization": "Bearer s3cret-key"})[0] == 200
        status, _, headers = _get(server.url + "?key=s3cret-key")
        assert (
            status == 303
            and "HttpOnly" in headers["Set-Cookie"]
            and "SameSite=Strict" in headers["Set-Cookie"]
        )
        cookie = headers["Set-Cookie"].split(";")[0]
        assert _get(server.url, {"Cookie": cookie})[0] == 200
        assert _get(server.url, {"Cookie": "rollflow_viewer_key=nope"})[0] == 401
    finally:
        server.shutdown()
        server.server_close()


def test_static_report_in_chromium(tmp_path: Path) -> None:
    _browser()
    storage = Storage.open(str(tmp_path / "store"), "exp", "trial")
    small_trial(storage)
    decoder = CharDecoder()
    page = static_report(TrajectoryQuery(storage), decoder, title="exp / trial", last_versions=2)
    path = tmp_path / "viewer.html"
    path.write_text(page)
    dom = render(path.as_uri())
    assert "The last 2 versions" in dom and "Prompts across versions" in dom
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom and "<script" not in dom


class _Anchors(HTMLParser):
    """Every id and every link target (href, form action) of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.targets: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        for name in ("href", "action", "src"):
            if a.get(name) is not None:
                self.targets.append(str(a[name]))


@pytest.mark.parametrize("last_versions", [1, 2])
def test_every_link_of_the_static_report_is_to_a_section_it_holds(tmp_path: Path, last_versions: int) -> None:
    """The MLflow artifact is one file with no server behind it: with the last version only, v0's row in
    the overview table, v0's trajectories in the prompt comparison and the group's siblings are not on the
    page, so they are text, not links to nowhere."""
    storage = Storage.open(str(tmp_path / "store"), "exp", "trial")
    small_trial(storage)
    decoder = CharDecoder()
    path = tmp_path / "viewer.html"
    path.write_text(static_report(TrajectoryQuery(storage), decoder, title="t", last_versions=last_versions))
    page = _Anchors()
    page.feed(path.read_text())
    assert page.targets, "the report links its sections"
    for target in page.targets:
        assert target.startswith("#") and target[1:] in page.ids, f"{target!r} goes nowhere in the file"
    assert "#v1" in page.targets and "#p-p-same" in page.targets  # what the page holds is still linked
    assert ("#v0" in page.targets) == (last_versions == 2)
