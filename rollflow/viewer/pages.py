"""The trajectory viewer's pages, built from SQL over the committed shards (``storage.query``).

What it is: ``Pages(query, decoder)`` renders, each from a few parameterised queries (no user SQL):

- ``overview()``: the run at a glance: reward, completion length, staleness and the share of groups
  with a learning signal per version (charts and a table), and the filter form;
- ``trajectories(TrajectoryFilter)``: rows filtered by version range, reward range, prompt (its id, or
  a substring of its decoded text) and finish reason, newest first, a page at a time;
- ``trajectory(traj_id)``: one row's prompt and completion tokens, coloured by the policy version that
  produced each token and, below, by its behaviour logprob (``html``), with its group's other rows;
- ``prompt(prompt_id)``: one prompt's answers version by version (how the policy's answer changed);
- ``static_report(...)``: the same overview plus the last versions' trajectories and prompt
  comparisons as one self-contained page (the MLflow artifact) whose links go only to its own sections
  (``StaticLinks``; what it does not hold is plain text).

Text is decoded with the run's tokenizer when one is given (else token ids are shown) and every piece
goes through ``html.esc``. What it is not: HTTP (``server``), the list's filter (``trajectory_filter``),
where links go (``links``) or data access beyond the views.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollflow.viewer import html as H
from rollflow.viewer.links import Links, StaticLinks, anchor, link
from rollflow.viewer.trajectory_filter import TrajectoryFilter
from storage.query import TrajectoryQuery

LIST_COLUMNS = (
    "traj_id, group_id, prompt_id, version, tail_version, reward, finish_reason, n_turns, "
    "prompt_ids, completion_ids, created_at"
)


class Pages:
    """Renders the viewer's pages for one trial (module docstring)."""

    def __init__(
        self, query: TrajectoryQuery, decoder: Any = None, *, title: str, links: Links | None = None
    ) -> None:
        self.query = query
        self.decoder = decoder
        self.title = title
        self.links = links or Links()

    # --- text -----------------------------------------------------------------------------------------

    def text(self, ids: Sequence[int]) -> str:
        if self.decoder is None:
            return " ".join(str(i) for i in ids)
        return self.decoder.decode(list(ids), skip_special_tokens=False)

    def piece(self, token_id: int) -> str:
        if self.decoder is None:
            return f"{token_id} "
        return self.decoder.decode([token_id], skip_special_tokens=False)

    def _nav(self) -> str:
        return f"<nav>{link(self.links.home(), 'overview')}{link(self.links.trajectories(), 'trajectories')}</nav>"

    def _page(self, title: str, body: str) -> str:
        return H.page(title, body, nav=self._nav())

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return self.query.sql(sql, list(params)).to_pylist()

    def _version_range(self) -> tuple[int, int]:
        r = self._rows("SELECT min(min_head_version) AS lo, max(max_head_version) AS hi FROM commits")[0]
        lo, hi = r["lo"], r["hi"]
        return (max(0, lo) if lo is not None else 0), (hi if hi is not None else 0)

    # --- overview -------------------------------------------------------------------------------------

    def glance(self, per_version: list[dict[str, Any]], *, table_rows: int = 50) -> str:
        """Charts and the per-version table (newest first, at most ``table_rows`` rows)."""
        if not per_version:
            return '<p class="muted">no committed trajectories yet</p>'
        xs = [r["version"] for r in per_version]
        charts = "".join(
            H.line_chart(xs, [r[key] for r in per_version], title=title)
            for key, title in (
                ("reward_mean", "reward mean per version"),
                ("completion_tokens_mean", "completion tokens per version"),
                ("staleness_mean", "staleness when trained"),
                ("signal_frac", "groups with reward spread"),
            )
        )
        groups = sum(r["groups"] for r in per_version)
        rows_n = sum(r["trajectories"] for r in per_version)
        summary = (
            f"<p>{len(per_version)} versions (v{xs[0]}..v{xs[-1]}), {groups} groups, {rows_n} trajectories "
            f'<span class="muted">(committed shards only)</span></p>'
        )
        rows = []
        for r in per_version[::-1][:table_rows]:
            reasons = ", ".join(f"{H.esc(k)} {v}" for k, v in sorted(dict(r["finish_reasons"] or []).items()))
            rows.append(
                [
                    link(self.links.trajectories(version=str(r["version"])), f"v{r['version']}"),
                    H.fmt(r["groups"]),
                    H.fmt(r["trajectories"]),
                    H.fmt(r["reward_mean"]),
                    H.fmt(r["signal_frac"], 2),
                    H.fmt(r["completion_tokens_mean"], 1),
                    H.fmt(r["staleness_mean"], 2),
                    H.fmt(r["staleness_max"]),
                    reasons,
                ]
            )
        headers = [
            "version",
            "groups",
            "rows",
            "reward",
            "signal",
            "completion",
            "staleness",
            "max stale",
            "finish",
        ]
        more = (
            f'<p class="muted">newest {table_rows} of {len(per_version)} versions shown</p>'
            if len(per_version) > table_rows
            else ""
        )
        return summary + f'<div class="charts">{charts}</div>' + H.table(headers, rows, left=(8,)) + more

    def _filter_form(self, f: TrajectoryFilter) -> str:
        p = f.params()

        def box(name: str, label: str) -> str:
            return f'<label>{H.esc(label)} <input name="{name}" value="{H.esc(p.get(name, ""))}"></label>'

        return (
            '<form class="filters" method="get" action="/trajectories">'
            + box("version", "version (V or LO:HI)")
            + box("min_reward", "reward >=")
            + box("max_reward", "reward <=")
            + box("prompt", "prompt (id or text)")
            + box("finish", "finish reason")
            + '<button type="submit">show</button></form>'
        )

    def overview(self, *, all_versions: bool = False) -> str:
        per_version = self._rows("SELECT * FROM per_version")
        body = self.glance(per_version, table_rows=len(per_version) if all_versions else 50)
        prompt_form = (
            '<form class="filters" method="get" action="/prompt"><label>compare one prompt across versions: '
            'prompt id <input name="id"></label><button type="submit">compare</button></form>'
        )
        return self._page(
            self.title,
            "<h2>Filter trajectories</h2>"
            + self._filter_form(TrajectoryFilter())
            + prompt_form
            + "<h2>The run at a glance</h2>"
            + body,
        )

    # --- lists ----------------------------------------------------------------------------------------

    def _list_rows(self, rows: list[dict[str, Any]]) -> str:
        out = []
        for r in rows:
            versions = (
                f"v{r['version']}"
                if r["version"] == r["tail_version"]
                else f"v{r['version']}-{r['tail_version']}"
            )
            out.append(
                [
                    link(self.links.trajectory(r["traj_id"]), versions),
                    H.fmt(r["reward"]),
                    H.esc(r["finish_reason"]),
                    link(self.links.prompt(r["prompt_id"]), H.esc(r["prompt_id"])),
                    f'<div class="text">{H.esc(self.text(r["prompt_ids"])[-300:])}</div>',
                    f'<div class="text">{H.esc(self.text(r["completion_ids"]))}</div>',
                ]
            )
        return H.table(
            ["version", "reward", "finish", "prompt id", "prompt (end)", "completion"], out, left=(2, 3, 4, 5)
        )

    def trajectories(self, f: TrajectoryFilter) -> str:
        cond, args = f.where(can_decode=self.decoder is not None and self.query.decode is not None)
        rows = self._rows(
            f"SELECT {LIST_COLUMNS} FROM trajectories WHERE {cond} "
            "ORDER BY created_at DESC, traj_id LIMIT ? OFFSET ?",
            [*args, f.limit + 1, f.offset],
        )
        more = len(rows) > f.limit
        rows = rows[: f.limit]
        pager = []
        if f.offset > 0:
            pager.append(
                link(self.links.trajectories(**f.params(offset=max(0, f.offset - f.limit))), "newer")
            )
        if more:
            pager.append(link(self.links.trajectories(**f.params(offset=f.offset + f.limit)), "older"))
        shown = (
            f"<p>rows {f.offset + 1}..{f.offset + len(rows)}, newest first {' '.join(pager)}</p>"
            if rows
            else '<p class="muted">no committed trajectory matches the filters</p>'
        )
        return self._page(
            f"{self.title}: trajectories",
            self._filter_form(f) + shown + (self._list_rows(rows) if rows else ""),
        )

    # --- one trajectory -------------------------------------------------------------------------------

    def tokens(self, row: Mapping[str, Any]) -> list[H.Token]:
        return [
            H.Token(self.piece(t), t, v, lp, m == 1)
            for t, v, lp, m in zip(
                row["input_ids"], row["versions"], row["logprobs"], row["loss_mask"], strict=True
            )
        ]

    def trajectory_body(self, row: Mapping[str, Any], vmin: int, vmax: int) -> str:
        toks = self.tokens(row)
        meta = H.table(
            [
                "traj id",
                "group",
                "prompt id",
                "versions",
                "reward",
                "finish",
                "turns",
                "tokens (prompt + completion)",
                "writer",
            ],
            [
                [
                    H.esc(row["traj_id"]),
                    H.esc(row["group_id"]),
                    link(self.links.prompt(row["prompt_id"]), H.esc(row["prompt_id"])),
                    f"v{row['version']}..v{row['tail_version']}",
                    H.fmt(row["reward"]),
                    H.esc(row["finish_reason"]),
                    H.fmt(row["n_turns"]),
                    f"{row['prompt_tokens']} + {row['completion_tokens']}",
                    H.esc(row["writer"]),
                ]
            ],
            left=(0, 1, 2, 8),
        )
        return (
            meta
            + "<h2>Tokens by policy version</h2>"
            + H.version_legend(vmin, vmax)
            + H.token_strip(toks, by="version", vmin=vmin, vmax=vmax)
            + "<h2>Tokens by behaviour logprob</h2>"
            + H.logprob_legend()
            + H.token_strip(toks, by="logprob", vmin=vmin, vmax=vmax)
        )

    def trajectory(self, traj_id: str) -> str | None:
        """The page of one row, or None if no committed row has that id."""
        rows = self._rows("SELECT * FROM trajectories WHERE traj_id = ? LIMIT 1", [traj_id])
        if not rows:
            return None
        row = rows[0]
        vmin, vmax = self._version_range()
        group = self._rows(
            "SELECT traj_id, reward, finish_reason, completion_tokens, completion_ids FROM trajectories "
            "WHERE group_id = ? ORDER BY traj_id",
            [row["group_id"]],
        )
        sib = [
            [
                link(self.links.trajectory(g["traj_id"]), H.esc(g["traj_id"])),
                H.fmt(g["reward"]),
                H.esc(g["finish_reason"]),
                f'<div class="text">{H.esc(self.text(g["completion_ids"]))}</div>',
            ]
            for g in group
        ]
        body = (
            self.trajectory_body(row, vmin, vmax)
            + "<h2>Its group</h2>"
            + H.table(["traj id", "reward", "finish", "completion"], sib, left=(0, 3))
        )
        return self._page(f"{self.title}: trajectory", body)

    # --- one prompt across versions -------------------------------------------------------------------

    def prompt_body(self, rows: list[dict[str, Any]], *, per_version: int = 8) -> str:
        by_version: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_version.setdefault(r["version"], []).append(r)
        summary = [
            [f"v{v}", H.fmt(len(rs)), H.fmt(sum(r["reward"] for r in rs) / len(rs))]
            for v, rs in sorted(by_version.items())
        ]
        parts = [f'<h2>Prompt</h2><div class="strip">{H.esc(self.text(rows[0]["prompt_ids"]))}</div>']
        parts.append(H.table(["version", "answers", "reward mean"], summary))
        for v, rs in sorted(by_version.items()):
            mean = sum(r["reward"] for r in rs) / len(rs)
            answers = [
                [
                    link(self.links.trajectory(r["traj_id"]), H.fmt(r["reward"])),
                    H.esc(r["finish_reason"]),
                    f'<div class="text">{H.esc(self.text(r["completion_ids"]))}</div>',
                ]
                for r in rs[:per_version]
            ]
            parts.append(f"<h2>v{v}: reward mean {mean:.3f}, {len(rs)} answers</h2>")
            parts.append(H.table(["reward", "finish", "answer"], answers, left=(2,)))
        return "".join(parts)

    def prompt_rows(self, prompt_id: str) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT traj_id, version, reward, finish_reason, prompt_ids, completion_ids FROM trajectories "
            "WHERE prompt_id = ? ORDER BY version, created_at, traj_id",
            [prompt_id],
        )

    def prompt(self, prompt_id: str) -> str | None:
        """One prompt's answers, version by version; None if no committed row has that prompt id."""
        rows = self.prompt_rows(prompt_id)
        if not rows:
            return None
        return self._page(f"{self.title}: prompt {prompt_id}", self.prompt_body(rows))


def static_report(
    query: TrajectoryQuery,
    decoder: Any = None,
    *,
    title: str,
    last_versions: int = 5,
    rows_per_version: int = 6,
    prompts: int = 4,
) -> str:
    """One self-contained page: the run at a glance, then the last versions' trajectories (tokens coloured
    by version and logprob) and a few prompts compared across those versions (module docstring). Every
    link is to a section of this page: what the page does not hold (an older version, a trajectory or a
    prompt not shown) is plain text, since the copy has no server behind it."""
    pages = Pages(query, decoder, title=title)
    per_version = pages._rows("SELECT * FROM per_version")
    versions = [r["version"] for r in per_version if r["version"] >= 0][-last_versions:]
    shown: dict[int, list[dict[str, Any]]] = {}  # version -> its rows on the page, newest version first
    compared: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []  # (prompt, its rows)
    for v in versions[::-1]:
        shown[v] = pages._rows(
            "SELECT * FROM trajectories WHERE version = ? "  # the best and the worst row of each group
            "QUALIFY row_number() OVER (PARTITION BY group_id ORDER BY reward DESC, traj_id) = 1 "
            "OR row_number() OVER (PARTITION BY group_id ORDER BY reward, traj_id) = 1 "
            "ORDER BY created_at DESC, group_id, reward DESC LIMIT ?",
            [v, rows_per_version],
        )
    if versions:
        top = pages._rows(
            "SELECT prompt_id, count(DISTINCT version) AS n FROM trajectories WHERE version >= ? "
            "GROUP BY prompt_id ORDER BY n DESC, prompt_id LIMIT ?",
            [versions[0], prompts],
        )
        compared = [(t, pages.prompt_rows(t["prompt_id"])) for t in top]
    pages.links = StaticLinks(
        versions,
        [r["traj_id"] for rows in shown.values() for r in rows],
        [t["prompt_id"] for t, _ in compared],
    )

    jump = (
        f"<nav>{link('#last' if versions else None, 'the last versions')}"
        f"{link('#prompts' if compared else None, 'prompts across versions')}</nav>"
    )
    parts = ['<a id="top"></a>', jump, pages.glance(per_version, table_rows=12)]
    if versions:
        vmin, vmax = pages._version_range()
        parts.append(f'<h2 id="last">The last {len(versions)} versions</h2>')
        for v, rows in shown.items():
            parts.append(f'<h2 id="v{v}">v{v}</h2>')
            for r in rows:
                head = f"reward {H.fmt(r['reward'])} | {H.esc(r['finish_reason'])} | {H.esc(r['prompt_id'])}: {H.esc(pages.text(r['completion_ids'])[:120])}"
                parts.append(
                    f'<details id="{H.esc(anchor("t-", r["traj_id"])[1:])}"><summary>{head}</summary>'
                    f"{pages.trajectory_body(r, vmin, vmax)}</details>"
                )
    if compared:
        parts.append('<h2 id="prompts">Prompts across versions</h2>')
    for t, rows in compared:
        parts.append(
            f'<details id="{H.esc(anchor("p-", t["prompt_id"])[1:])}"><summary>prompt {H.esc(t["prompt_id"])}: '
            f"{t['n']} of the last versions</summary>{pages.prompt_body(rows, per_version=4)}</details>"
        )
    return H.page(title, "".join(parts))
