"""Where a viewer page links to: the server's routes, or anchors inside the one static page.

What it is: ``Links`` (the HTTP server's routes), ``StaticLinks`` (the MLflow artifact's in-page anchors,
only to sections it holds), ``anchor`` and ``link``. What it is not: the pages (``rollflow.viewer.pages``).
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import quote, urlencode

from rollflow.viewer import html as H


class Links:
    """Where a page links to: the server's routes (``StaticLinks``: anchors inside one page). None: the
    target is not there, and the text is shown without a link."""

    def home(self) -> str | None:
        return "/"

    def trajectories(self, **params: str) -> str | None:
        return "/trajectories?" + urlencode(params)

    def trajectory(self, traj_id: str) -> str | None:
        return "/trajectory?" + urlencode({"id": traj_id})

    def prompt(self, prompt_id: str) -> str | None:
        return "/prompt?" + urlencode({"id": prompt_id})


class StaticLinks(Links):
    """Anchors of the one static page, only to the sections it holds: ``versions`` (``#v{N}``), the
    trajectories shown (``#t-{id}``) and the prompts compared (``#p-{id}``); anything else is None."""

    def __init__(self, versions: Sequence[int] = (), trajs: Sequence[str] = (), prompts: Sequence[str] = ()):
        self.versions, self.trajs, self.prompts = set(versions), set(trajs), set(prompts)

    def home(self) -> str | None:
        return "#top"

    def trajectories(self, **params: str) -> str | None:
        v = params.get("version")
        if v is None:
            return "#last" if self.versions else None
        return f"#v{v}" if v.lstrip("-").isdigit() and int(v) in self.versions else None

    def trajectory(self, traj_id: str) -> str | None:
        return anchor("t-", traj_id) if traj_id in self.trajs else None

    def prompt(self, prompt_id: str) -> str | None:
        return anchor("p-", prompt_id) if prompt_id in self.prompts else None


def anchor(prefix: str, key: str) -> str:
    """The in-page link to the section whose id is ``prefix`` + the quoted key."""
    return "#" + prefix + quote(key, safe="")


def link(href: str | None, text: str) -> str:
    """``<a href>text</a>``, or ``text`` alone when there is nowhere to go (``text`` is already HTML)."""
    return text if href is None else f'<a href="{H.esc(href)}">{text}</a>'
