"""The read-only web viewer: a Flask app over one open pool.

Pages are rendered on the server from Jinja templates (autoescaped: model output is
untrusted text); the one stylesheet and the one small script ship inside the package, so
the viewer works on machines without internet.  Every route is a GET that reads the catalog
(and, for a sample, the one chunk that holds it); none changes the pool.  Request parameters
are validated and never become paths.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, NoReturn

from flask import Blueprint, Flask, current_app, jsonify, render_template, request, url_for
from flask import g as per_request
from flask.wrappers import Response
from jinja2 import StrictUndefined
from werkzeug.exceptions import HTTPException

from .._util.humanize import human_size, local_time
from ..catalog.queries import task_texts_of
from ..errors import (
    ArchiveError,
    ArchiveNotFoundError,
    ArchiveReleasedError,
    IntegrityError,
    InvalidInputError,
    InvalidNameError,
    MissingDependencyError,
)
from ..lens.rewards import check_reward_key
from ..lens.search import MAX_PATTERN, SEARCH_FIELDS
from ..lens.stats import (
    RolloutKey,
    RolloutRange,
    archive_summary,
    check_rollout_key,
    check_rollout_range,
    rollout_stats,
)
from ..lens.tokenizer import TokenDecoder
from ..manager import ArchiveManager
from .charts import Series, drift_charts, line_chart
from .hosts import LOOPBACK, HostPolicy
from .markdown import MAX_MARKDOWN, MAX_MARKDOWN_PAGE, markdown_available, render_markdown
from .present import DEFAULT_TOKENS_SHOWN, jsonable, pretty_json, resolve_tensor, sample_view
from .present import tensor_summary as summarize_tensor
from .queries import (
    SAMPLE_SORTS,
    SampleFilter,
    archive_page,
    entry_of,
    sample_page,
    task_positions,
)

__all__ = ["create_app"]

_POOL_KEY = "archive_manager.pool"
_TOKENIZER_KEY = "archive_manager.tokenizer"
_HOSTS_KEY = "archive_manager.hosts"
#: Matches one search page lists at most, and the seconds it may run (a viewer's worker
#: must not be held by a runaway regular expression: docs/architecture/search.md, "Search").
MAX_SEARCH_LIMIT = 1000
SEARCH_TIMEOUT = 20.0
MAX_PER_PAGE = 1000
#: Positions beyond this cannot exist (the catalog stores them as 32-bit ints); refusing
#: them early keeps a huge number from overflowing the database driver.
_MAX_POSITION = 2**31 - 1
_MAX_TEXT = 255
_MAX_GROUP = 256  # completions whose responses a group page loads

# NOTE: a strict policy is a second line behind autoescaping: even if some model output
# slipped through unescaped, the browser would run no inline script and load nothing from
# elsewhere.  Charts are inline SVG styled by classes, so no inline style is needed either.
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}

viewer = Blueprint("viewer", __name__)


class NotFound(ArchiveError, LookupError):
    """A page names something the pool does not hold (a position, a tensor field)."""


# --------------------------------------------------------------------------- parameters


_WHOLE = re.compile(r"-?[0-9]+")


def _bad(name: str, detail: str) -> NoReturn:
    raise InvalidInputError(f"bad query parameter {name!r}: {detail}")


def _whole(text: str) -> int:
    """``text`` as an int written in ASCII digits with an optional minus: `int` also takes
    ``1_0``, ``+1`` and other scripts' digits, so a mangled link would start a page
    somewhere else instead of failing."""
    if _WHOLE.fullmatch(text) is None:
        raise ValueError(text)
    return int(text)


def _single(name: str) -> str | None:
    """The parameter ``name`` as given (unstripped); a 400 if it is given with different
    values."""
    values = request.args.getlist(name)
    if len(set(values)) > 1:
        # the same value twice is harmless; two values would leave one of them unread
        _bad(name, "is given more than once, with different values")
    return values[0] if values else None


def _raw(name: str) -> str | None:
    value = _single(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def _int(name: str, default: int, low: int, high: int) -> int:
    text = _raw(name)
    if text is None:
        return default
    try:
        value = _whole(text)
    except ValueError:
        _bad(name, f"{text[:40]!r} is not a whole number")
    if not low <= value <= high:
        _bad(name, f"{value} is not between {low} and {high}")
    return value


def _optional_int(name: str, low: int, high: int) -> int | None:
    return None if _raw(name) is None else _int(name, low, low, high)


def _float(name: str) -> float | None:
    text = _raw(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        _bad(name, f"{text[:40]!r} is not a number")
    if not math.isfinite(value):
        _bad(name, "must be a finite number")
    return value


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    text = _raw(name)
    if text is None:
        return default
    if text not in choices:
        _bad(name, f"{text[:40]!r} is not one of {', '.join(choices)}")
    return text


def _evaluation() -> bool | None:
    value = _choice("evaluation", ("any", "yes", "no"), "any")
    return None if value == "any" else value == "yes"


def _text(name: str) -> str | None:
    text = _raw(name)
    if text is not None and (len(text) > _MAX_TEXT or any(ord(c) < 0x20 for c in text)):
        _bad(name, f"must be at most {_MAX_TEXT} printable characters")
    return text


def _reward_key() -> str | None:
    """``reward_key``: the key of dict rewards the page reads as the reward instead of the one
    each archive was saved with (docs/lens.md, "Rewards")."""
    key = _text("reward_key")
    if key is None:
        return None
    try:
        return check_reward_key(key)
    except InvalidInputError as exc:
        _bad("reward_key", str(exc))


def _rollout_range() -> RolloutRange | None:
    text = _raw("rollout_id")
    if text is None:
        return None
    low_text, sep, high_text = text.partition("..")
    try:
        low = _whole(low_text.strip()) if low_text.strip() else None
        high = _whole(high_text.strip()) if high_text.strip() else None
    except ValueError:
        _bad("rollout_id", f"{text[:40]!r} is not a rollout id or a range A..B")
    if not sep:
        return check_rollout_range(low)
    if low is None and high is None:
        _bad("rollout_id", "a range needs at least one end (A..B, A.. or ..B)")
    try:
        return check_rollout_range((low, high))
    except InvalidInputError as exc:
        _bad("rollout_id", str(exc))


def _rollout_after() -> RolloutKey | None:
    """The stats page's ``after``: the key of the previous page's last row, as
    `_rollout_key_text` writes it (``12:training``, ``12:evaluation``, ``none:training``)."""
    text = _text("after")
    if text is None:
        return None
    rollout_text, sep, kind = text.rpartition(":")
    if not sep or kind not in ("training", "evaluation"):
        _bad("after", f"{text[:40]!r} is not ROLLOUT_ID:training or ROLLOUT_ID:evaluation")
    try:
        rollout_id = None if rollout_text == "none" else _whole(rollout_text)
        return check_rollout_key((rollout_id, kind == "evaluation"))
    except (ValueError, InvalidInputError):
        _bad("after", f"{rollout_text[:40]!r} is not a rollout id (or none)")


def _rollout_key_text(rollout_id: int | None, evaluation: bool) -> str:
    return f"{'none' if rollout_id is None else rollout_id}:{'evaluation' if evaluation else 'training'}"


def _wants_json() -> bool:
    return _choice("format", ("html", "json"), "html") == "json"


def _page() -> tuple[int, int]:
    per_page = _int("per_page", 100, 1, MAX_PER_PAGE)
    return _int("page", 1, 1, 10**9), per_page


def _pages(total: int, per_page: int) -> int:
    return max(1, math.ceil(total / per_page))


def _pool() -> ArchiveManager:
    pool: ArchiveManager = current_app.extensions[_POOL_KEY]
    return pool


def _decoder() -> TokenDecoder | None:
    decoder: TokenDecoder | None = current_app.extensions.get(_TOKENIZER_KEY)
    return decoder


def _markdown() -> bool:
    """Whether the page shows responses as rendered Markdown (``?view=markdown``)."""
    return _choice("view", ("text", "markdown"), "text") == "markdown" and markdown_available()


def _rendered(text: str | None, markdown: bool) -> Any:
    """``text`` as Markdown HTML when asked for and not too long, and while the request's
    budget (`MAX_MARKDOWN_PAGE`) lasts; else None (shown as text)."""
    if not markdown or text is None or len(text) > MAX_MARKDOWN:
        return None
    spent = per_request.get("markdown_spent", 0) + len(text)
    if spent > MAX_MARKDOWN_PAGE:
        return None
    per_request.markdown_spent = spent
    return render_markdown(text)


def _respond(
    template: str,
    data: Callable[[], Any],
    html_only: Callable[[], dict[str, Any]] | None = None,
    **context: Any,
) -> Any:
    """The JSON of ``data()`` or the page; ``html_only()`` adds context only the page needs
    (the charts), so a JSON request never builds it."""
    if _wants_json():
        return jsonify(jsonable(data()))
    return render_template(template, **context, **(html_only() if html_only else {}))


# --------------------------------------------------------------------------- pages


def _archive_json(info: Any, owners: list[str], chunks: int | None) -> dict[str, Any]:
    return {**asdict(info), "owners": owners, "chunks": chunks}


@viewer.get("/")
def pool_page() -> Any:
    """The pool: its archives by rollout (state, samples, bytes, owners) and drift charts."""
    pool = _pool()
    _wants_json()  # a bad format is a 400 before any work
    state = _choice("state", ("visible", "published", "released"), "visible")
    states = ("published", "released") if state == "visible" else (state,)
    rollout_ids, evaluation = _rollout_range(), _evaluation()
    reward_key = _reward_key()
    page, per_page = _page()
    # The "next" link names the page's last archive: deep pages by keyset, not by offset
    # (docs/architecture/summaries-and-paging.md, "Summaries and paging"); ``page`` then only
    # numbers the page.
    after = _text("after")
    listing = archive_page(
        pool,
        states=states,
        rollout_ids=rollout_ids,
        evaluation=evaluation,
        offset=(page - 1) * per_page,
        limit=per_page,
        after=after,
    )
    summary = pool.info()
    # The statistics of the rollouts of the archives the page lists, not of every rollout of
    # the pool (the stats page pages through them all): at 10,000 rollouts the whole table
    # was most of the page's time, and the JSON held every rollout
    # (docs/architecture/summaries-and-paging.md, "Summaries and paging").  Only the page's charts
    # need every rollout.
    listed = {(a.rollout_id, a.evaluation) for a in listing.archives}

    def charts() -> dict[str, Any]:
        rows = pool.stats(rollout_ids, evaluation, reward_key=reward_key)
        return {
            "charts": drift_charts(rows),
            "stats": [r for r in rows if (r.rollout_id, r.evaluation) in listed],
            "stats_rows": len(rows),
        }

    return _respond(
        "pool.html",
        lambda: {
            "pool": summary.as_dict(),
            "total": listing.total,
            "page": page,
            "per_page": per_page,
            "next_after": listing.archives[-1].name if len(listing.archives) == per_page else None,
            "archives": [
                _archive_json(i, listing.owners.get(i.name, []), listing.chunks.get(i.name))
                for i in listing.archives
            ],
            "stats": [
                r.as_dict()
                for r in rollout_stats(
                    pool.context, rollout_ids, evaluation, keys=listed, reward_key=reward_key
                )
            ],
        },
        charts,
        summary=summary,
        listing=listing,
        page=page,
        pages=_pages(listing.total, per_page),
        per_page=per_page,
        state=state,
        next_url=(
            _query_url(page=page + 1, after=listing.archives[-1].name) if listing.archives else None
        ),
    )


@viewer.get("/stats")
def stats_page() -> Any:
    """Training-drift statistics per rollout: the charts of every rollout, and a table (or
    the JSON) of one page of rows by keyset (``after``, ``per_page``)."""
    pool = _pool()
    _wants_json()
    rollout_ids, evaluation = _rollout_range(), _evaluation()
    per_page = _int("per_page", 100, 1, MAX_PER_PAGE)
    if _raw("page") is not None:
        # The other pages' offset means nothing here (rows page by key): ignored, a stale
        # ?page=2 link silently showed the first page as if it were the second.
        _bad("page", "the stats page pages by after= (the link of its next page), not page=")
    after = _rollout_after()
    reward_key = _reward_key()
    # One row more than the page says whether a next page exists.
    rows = pool.stats(
        rollout_ids, evaluation, limit=per_page + 1, after=after, reward_key=reward_key
    )
    more, rows = len(rows) > per_page, rows[:per_page]
    next_after = _rollout_key_text(rows[-1].rollout_id, rows[-1].evaluation) if more else None
    return _respond(
        "stats.html",
        lambda: {
            "per_page": per_page,
            "after": None if after is None else _rollout_key_text(*after),
            "next_after": next_after,
            "stats": [r.as_dict() for r in rows],
        },
        lambda: {
            "charts": drift_charts(pool.stats(rollout_ids, evaluation, reward_key=reward_key))
        },
        stats=rows,
        first_url=_query_url(after=None) if after is not None else None,
        next_url=_query_url(after=next_after) if next_after else None,
    )


def _sample_filter() -> SampleFilter:
    statuses = tuple(s.strip() for s in request.args.getlist("status") if s.strip())
    for status in statuses:
        if len(status) > _MAX_TEXT:
            _bad("status", "too long")
    return SampleFilter(
        statuses=statuses,
        task_key=_text("task_key"),
        sample_key=_text("sample_key"),
        min_reward=_float("min_reward"),
        max_reward=_float("max_reward"),
        min_length=_optional_int("min_length", 0, _MAX_POSITION),
        max_length=_optional_int("max_length", 0, _MAX_POSITION),
        sort=_choice("sort", SAMPLE_SORTS, "position"),
        descending=_choice("order", ("asc", "desc"), "asc") == "desc",
        reward_key=_reward_key(),
    )


@viewer.get("/archive/<name>")
def archive_view(name: str) -> Any:
    """One archive: its fields, owners, a summary, and its samples filtered and sorted."""
    pool = _pool()
    _wants_json()
    where = _sample_filter()
    page, per_page = _page()
    arc = pool.open_archive(name)
    info, owners, chunks = arc.info(), arc.owners(), arc.chunks()
    summary = archive_summary(pool.context, name)
    samples = sample_page(pool, name, where, offset=(page - 1) * per_page, limit=per_page)
    return _respond(
        "archive.html",
        lambda: {
            "archive": {
                **_archive_json(info, owners, len(chunks)),
                "attrs": arc.attrs,
                "reward_key": arc.reward_key,
            },
            "reward_key": where.reward_key or arc.reward_key,
            "summary": {**asdict(summary), "status": dict(summary.status)},
            "total": samples.total,
            "page": page,
            "per_page": per_page,
            "samples": samples.rows,
        },
        arc=arc,
        info=info,
        owners=owners,
        chunks=chunks,
        attrs_json=pretty_json(arc.attrs) if arc.attrs else None,
        summary=summary,
        samples=samples,
        where=where,
        reward_key=where.reward_key or arc.reward_key,
        sorts=SAMPLE_SORTS,
        page=page,
        pages=_pages(samples.total, per_page),
        per_page=per_page,
    )


def _position(name: str, position: int) -> dict[str, Any]:
    entry = entry_of(_pool(), name, position) if position <= _MAX_POSITION else None
    if entry is None:
        raise NotFound(f"archive {name!r} has no sample at position {position}")
    return entry


@viewer.get("/archive/<name>/sample/<int:position>")
def sample_view_page(name: str, position: int) -> Any:
    """One sample: texts, tokens with the loss mask, log-probs, metadata, tensor shapes."""
    pool = _pool()
    _wants_json()
    tokens = _choice("tokens", ("some", "all"), "some")
    markdown = _markdown()
    arc = pool.open_archive(name)
    entry = _position(name, position)
    sample = arc.load_sample(position)
    decoder = _decoder()
    view = sample_view(
        sample, tokens=None if tokens == "all" else DEFAULT_TOKENS_SHOWN, decoder=decoder
    )
    return _respond(
        "sample.html",
        lambda: {
            "archive": arc.name,
            "position": position,
            "sample_key": entry["sample_key"],
            "task_key": entry["task_key"],
            "catalog": entry["description"],
            "class": view.class_name,
            "fields": view.fields,
            **(
                {"response_tokens": [t.__dict__ for t in view.tokens]}
                if decoder is not None
                else {}
            ),
        },
        arc=arc,
        position=position,
        entry=entry,
        view=view,
        decoder=decoder,
        markdown=markdown,
        markdown_available=markdown_available(),
        response_html=_rendered(view.response, markdown),
        previous=position - 1 if position > 0 else None,
        following=position + 1 if position + 1 < len(arc) else None,
    )


@viewer.get("/archive/<name>/group")
def group_page(name: str) -> Any:
    """One prompt group: its completions side by side (reward, GRPO advantage, length,
    status, response text); reads only the chunks that hold them."""
    pool = _pool()
    _wants_json()
    key = _text("task_key")
    index = _optional_int("group_index", -(2**63), 2**63 - 1) if key is None else None
    if key is None and index is None:
        _bad("task_key", "give the group's task key (or group_index)")
    reward_key = _reward_key()
    arc = pool.open_archive(name)
    groups = pool.groups(name, reward_key=reward_key)
    if key is not None:
        found = [g for g in groups if g.task_key == key]
    else:
        found = [g for g in groups if g.field == "group_index" and g.group_index == index]
    if not found:
        what = f"task key {key!r}" if key is not None else f"group_index {index}"
        raise NotFound(f"archive {name!r} has no group with {what}")
    group = found[0]
    responses: dict[int, str | None] = {}
    # One load reads each chunk holding a member once; a huge "group" (a task key on every
    # sample) is shown from the catalog only.
    samples: list[Any] = []
    if len(group.members) <= _MAX_GROUP:
        samples = (
            arc.load_samples(task_key=key)
            if key is not None
            else [arc[m.position] for m in group.members]
        )
    for member, sample in zip(group.members, samples, strict=False):
        responses[member.position] = sample_view(sample, tokens=0).response
    order = _choice("sort", ("position", "reward", "length"), "position")
    markdown = _markdown()
    members = list(group.members)
    if order == "reward":
        members.sort(key=lambda m: (m.reward is None, -(m.reward or 0.0)))
    elif order == "length":
        members.sort(key=lambda m: (m.response_length is None, -(m.response_length or 0)))
    return _respond(
        "group.html",
        lambda: {
            "archive": arc.name,
            "group": group.as_dict(),
            "responses": {str(k): v for k, v in responses.items()},
        },
        arc=arc,
        group=group,
        reward_key=group.reward_key,
        members=members,
        responses=responses,
        rendered={k: _rendered(v, markdown) for k, v in responses.items()},
        markdown=markdown,
        markdown_available=markdown_available(),
        shown=bool(samples),
    )


#: The orders of the groups page: the first is the default (the spread GRPO learns from).
_GROUP_SORTS = ("reward_std", "reward_mean", "size", "task_key")


def _group_order(group: Any, sort: str) -> tuple[Any, ...]:
    if sort == "task_key":
        return (group.task_key is None, group.task_key or "")
    value = getattr(group, sort)
    return (value is None, -(value or 0), group.task_key is None, group.task_key or "")


@viewer.get("/archive/<name>/groups")
def groups_page(name: str) -> Any:
    """The prompt groups of an archive, with their reward spread, sorted by reward std (or
    mean, size, task key), each linking to its group page; from the catalog alone."""
    pool = _pool()
    _wants_json()
    sort = _choice("sort", _GROUP_SORTS, _GROUP_SORTS[0])
    page, per_page = _page()
    reward_key = _reward_key()
    arc = pool.open_archive(name)
    ordered = sorted(pool.groups(name, reward_key=reward_key), key=lambda g: _group_order(g, sort))
    shown = ordered[(page - 1) * per_page : page * per_page]
    return _respond(
        "groups.html",
        lambda: {
            "archive": arc.name,
            "sort": sort,
            "total": len(ordered),
            "page": page,
            "per_page": per_page,
            "reward_key": reward_key or arc.reward_key,
            "groups": [{k: v for k, v in g.as_dict().items() if k != "members"} for g in shown],
        },
        arc=arc,
        groups=shown,
        reward_key=reward_key or arc.reward_key,
        reward_key_given=reward_key is not None,
        unscored=sum(g.unscored for g in ordered),
        sort=sort,
        sorts=_GROUP_SORTS,
        zero_variance=sum(g.zero_variance for g in ordered),
        total=len(ordered),
        page=page,
        pages=_pages(len(ordered), per_page),
    )


@viewer.get("/prompt")
def prompt_page() -> Any:
    """One prompt across training: per rollout its group size, mean reward, pass rate and
    mean length (a chart and a table), each rollout linking to its group pages."""
    pool = _pool()
    _wants_json()
    key = _text("task_key")
    if key is None:
        _bad("task_key", "give the prompt's task key")
    history = pool.prompt_history(key, _rollout_range(), evaluation=_evaluation())
    if not history:
        # An unknown task key is a 404, as on the group page (it was an empty 200 page).
        raise NotFound(f"no rollout (of those asked for) saw a prompt with task key {key!r}")
    firsts = {
        name: positions[0]
        for name, positions in task_positions(
            pool, key, sorted({a for h in history for a in h.archives})
        ).items()
    }

    def charts() -> dict[str, Any]:
        series = []
        for evaluation, label, style in ((False, "training", 0), (True, "evaluation", 3)):
            part = [h for h in history if h.evaluation is evaluation and h.rollout_id is not None]
            if part:
                xs = [float(h.rollout_id) for h in part if h.rollout_id is not None]
                series.append(
                    Series(f"{label} mean reward", xs, [h.reward_mean for h in part], style)
                )
                series.append(
                    Series(
                        f"{label} pass rate",
                        xs,
                        [h.pass_rate for h in part],
                        style + 1,
                        dashed=True,
                    )
                )
        return {"chart": line_chart("reward by rollout", series, x_label="rollout id")}

    with pool.catalog.read() as conn:
        text = task_texts_of(conn, [key]).get(key)
    return _respond(
        "prompt.html",
        lambda: {"task_key": key, "task_text": text, "history": [h.as_dict() for h in history]},
        charts,
        task_key=key,
        task_text=text,
        history=history,
        firsts=firsts,
    )


def _search_text() -> str | None:
    # not `_raw`, which would strip the pattern; ?q=a&q=b searched for "a" alone before
    text = _single("q")
    if text is None or not text.strip():
        return None
    if len(text) > MAX_PATTERN or any(ord(c) < 0x20 and c != "\t" for c in text):
        _bad("q", f"must be at most {MAX_PATTERN} characters, without control characters")
    return text


@viewer.get("/search")
def search_page() -> Any:
    """Samples whose prompt or response holds ``q`` (``regex=1``: a regular expression),
    with archive, position, keys, reward and the matched line; reads only the text fields of
    the chunks it scans, for at most 20 seconds."""
    pool = _pool()
    wants_json = _wants_json()
    text = _search_text()
    regex = _choice("regex", ("0", "1"), "0") == "1"
    ignore_case = _choice("case", ("exact", "ignore"), "exact") == "ignore"
    # NOTE: not ``field``, which is the tensor page's path argument (see _QUERY_PARAMETERS).
    field = _choice("fields", ("all", *SEARCH_FIELDS), "all")
    rollout_ids, evaluation = _rollout_range(), _evaluation()
    limit = _int("limit", 100, 1, MAX_SEARCH_LIMIT)
    if text is None:
        if wants_json:
            _bad("q", "give the text to search for")
        result = None
    else:
        result = pool.search(
            text,
            regex=regex,
            ignore_case=ignore_case,
            fields=field,
            rollout_ids=rollout_ids,
            evaluation=evaluation,
            limit=limit,
            timeout=SEARCH_TIMEOUT,
        )
    return _respond(
        "search.html",
        lambda: result.as_dict() if result is not None else {},
        q=text or "",
        regex=regex,
        ignore_case=ignore_case,
        field=field,
        fields=("all", *SEARCH_FIELDS),
        limit=limit,
        result=result,
    )


def _side(which: str) -> tuple[Any, int, dict[str, Any]]:
    name = _text(which)
    if name is None:
        _bad(which, "give the archive of each sample to compare (a, b)")
    position = _int(f"{which}_position", 0, 0, _MAX_POSITION)
    arc = _pool().open_archive(name)
    return arc, position, _position(name, position)


@viewer.get("/compare")
def compare_page() -> Any:
    """Two samples side by side (``a``/``a_position`` and ``b``/``b_position``): facts,
    prompts and responses, e.g. one prompt in two rollouts; reads the two chunks."""
    pool = _pool()
    _wants_json()
    markdown = _markdown()
    sides = []
    for which in ("a", "b"):
        arc, position, entry = _side(which)
        view = sample_view(arc.load_sample(position), tokens=0)
        others: list[int] = []
        if entry["task_key"] is not None:
            others = task_positions(pool, entry["task_key"], [arc.name]).get(arc.name, [])
        sides.append(
            {
                "which": which,
                "arc": arc,
                "position": position,
                "entry": entry,
                "view": view,
                "others": others,
                "html": _rendered(view.response, markdown),
            }
        )
    return _respond(
        "compare.html",
        lambda: {
            s["which"]: {
                "archive": s["arc"].name,
                "rollout_id": s["arc"].rollout_id,
                "position": s["position"],
                "sample_key": s["entry"]["sample_key"],
                "task_key": s["entry"]["task_key"],
                "status": s["view"].status,
                "reward": s["view"].reward,
                "response_tokens": s["view"].response_tokens,
                "prompt": s["view"].prompt_text,
                "response": s["view"].response,
            }
            for s in sides
        },
        sides=sides,
        same_prompt=(
            sides[0]["view"].prompt_text == sides[1]["view"].prompt_text
            and sides[0]["view"].prompt_messages == sides[1]["view"].prompt_messages
        ),
        markdown=markdown,
        markdown_available=markdown_available(),
    )


@viewer.get("/archive/<name>/sample/<int:position>/tensor/<field>")
def tensor_page(name: str, position: int, field: str) -> Any:
    """Load one tensor field of a sample (its blob is read now) and summarize it."""
    pool = _pool()
    _wants_json()
    arc = pool.open_archive(name)
    _position(name, position)
    try:
        value = resolve_tensor(arc.load_sample(position), field)
    except KeyError as exc:
        raise NotFound(
            f"sample {position} of archive {name!r} has no tensor field {field!r}"
        ) from exc
    summary = summarize_tensor(value)
    return _respond(
        "tensor.html", lambda: summary, arc=arc, position=position, field=field, summary=summary
    )


# --------------------------------------------------------------------------- errors


def _error(status: int, title: str, message: str) -> Any:
    if request.args.get("format") == "json":
        response = jsonify({"error": message, "status": status, "title": title})
    else:
        response = current_app.response_class(
            render_template("error.html", status=status, title=title, message=message),
            mimetype="text/html",
        )
    response.status_code = status
    return response


def _handle(exc: Exception) -> Any:
    if isinstance(exc, HTTPException):
        return _error(exc.code or 500, exc.name, exc.description or exc.name)
    # A malformed archive name in a URL names no archive: not found, like any unknown name.
    if isinstance(exc, (ArchiveNotFoundError, NotFound, InvalidNameError)):
        return _error(404, "Not found", str(exc))
    if isinstance(exc, InvalidInputError):
        return _error(400, "Bad request", str(exc))
    if isinstance(exc, ArchiveReleasedError):
        return _error(410, "Released", str(exc))
    if isinstance(exc, IntegrityError):
        return _error(500, "Damaged data", str(exc))
    if isinstance(exc, MissingDependencyError):
        # Not the client's error (no 4xx) and nothing failed (no 500, which monitoring and
        # retries read as a crash): this install lacks a feature, which 501 says; the page
        # names the extra that brings it.
        return _error(501, "Not available here", str(exc))
    if isinstance(exc, ArchiveError):
        return _error(500, "Error", str(exc))
    current_app.logger.exception("unexpected error on %s", request.path)
    return _error(500, "Internal error", "the viewer failed; the server log has the details")


def _check_host() -> Response | None:
    """Refuse a request sent to a host name the viewer was not bound to (DNS rebinding:
    web/hosts.py), before any route reads the pool: a 421 whose body holds no data."""
    policy: HostPolicy = current_app.extensions[_HOSTS_KEY]
    header = request.environ.get("HTTP_HOST")
    if policy.allows(header):
        return None
    # The operator's log names the refused host, so that a name of their own (a proxy, an
    # alias) can be added with --allow-host; the response does not echo it.
    current_app.logger.warning(
        "refused a request for host %r: not a host this viewer answers", (header or "")[:100]
    )
    return current_app.response_class(
        "421 Misdirected Request: this viewer does not answer requests for that host name. "
        "If you reach it by a name of your own, its operator can allow that name with "
        "archive-manager serve --allow-host NAME.\n",
        status=421,
        mimetype="text/plain",
    )


def _secure(response: Any) -> Any:
    for header, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(header, value)
    return response


# --------------------------------------------------------------------------- app


#: The query parameters the pages read; links keep these and drop anything else, so a
#: request key can never reach `url_for` as one of its own arguments (``endpoint``,
#: ``_external``, ``_anchor`` ...) or a view's path argument (``name``, ``position``).
_QUERY_PARAMETERS = frozenset(
    {
        "format",
        "state",
        "rollout_id",
        "evaluation",
        "page",
        "per_page",
        "after",
        "status",
        "task_key",
        "group_index",
        "reward_key",
        "sample_key",
        "min_reward",
        "max_reward",
        "min_length",
        "max_length",
        "sort",
        "order",
        "tokens",
        "view",
        "q",
        "regex",
        "case",
        "fields",
        "limit",
        "a",
        "a_position",
        "b",
        "b_position",
    }
)


def _query_url(**changes: Any) -> str:
    """The current page's URL with some query parameters changed (None drops one); only the
    viewer's own parameters are carried over."""
    args = {k: v for k, v in request.args.to_dict(flat=False).items() if k in _QUERY_PARAMETERS}
    for key, value in changes.items():
        if key not in _QUERY_PARAMETERS:
            raise ValueError(f"query_url: {key!r} is not a query parameter of the viewer")
        if value is None:
            args.pop(key, None)
        else:
            args[key] = [str(value)]
    values: dict[str, Any] = {**(request.view_args or {}), **args}
    return url_for(request.endpoint or "viewer.pool_page", **values)


def _num(value: Any, fmt: str = ".3g", missing: str = "–") -> str:
    """Format a number for a page; ``missing`` for None (or a value that is no number)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return missing if value is None else str(value)
    return format(value, fmt)


class _Response(Response):
    """A page whose text holds a lone surrogate (legal in model output, stored and loaded as
    it is) shows it as an escape (``\\ud800``, as the CLI does) instead of failing: UTF-8
    cannot encode it, and every HTML page showing such a text was a 500 (tests/web/test_web.py).
    JSON escapes it already."""

    def set_data(self, value: bytes | str) -> None:
        if isinstance(value, str):
            value = value.encode("utf-8", "backslashreplace")
        super().set_data(value)


def create_app(
    pool: ArchiveManager,
    *,
    tokenizer: TokenDecoder | None = None,
    hosts: HostPolicy | None = None,
) -> Flask:
    """A Flask app that shows ``pool`` read-only (the caller keeps the pool open); with
    ``tokenizer`` (`load_tokenizer`), sample pages show response tokens as text pieces.

    It answers only requests whose ``Host`` is one of ``hosts`` (`host_policy`; by default
    ``localhost`` and the loopback addresses, a loopback bind's), every other with a 421.
    """
    app = Flask(__name__)
    app.response_class = _Response
    app.extensions[_POOL_KEY] = pool
    app.extensions[_TOKENIZER_KEY] = tokenizer
    app.extensions[_HOSTS_KEY] = LOOPBACK if hosts is None else hosts
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # Fail loudly in tests on a template typo instead of rendering an empty string.
    app.jinja_env.undefined = StrictUndefined
    app.jinja_env.filters["size"] = human_size
    app.jinja_env.filters["when"] = local_time
    app.jinja_env.filters["num"] = _num
    app.jinja_env.filters["tojson_pretty"] = lambda value: pretty_json(value, preview=None)
    app.jinja_env.globals["query_url"] = _query_url
    app.register_blueprint(viewer)
    app.register_error_handler(Exception, _handle)
    # NOTE: the first hook, registered on the app: it runs before every route, the static
    # files' and the 404/405 of a URL no route matches included.
    app.before_request(_check_host)
    app.after_request(_secure)
    return app
