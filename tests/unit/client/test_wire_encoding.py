"""`client/wire.py` sends the request targets and JSON bodies httpx sent (the server, its
route rules and its logs see the same requests whichever wire is used): checked against
httpx itself. Two cases differ on purpose: a path's '.'/'..' segments, which httpx resolves
into another route (`client.http.checked_path` refuses them before any wire), and a path with
a query of its own given ``params`` too, which httpx drops for the params; the wire keeps
both."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from batchyard.client.wire_encoding import json_body, query_string, target

PATHS = ["/workspaces/default/jobs", "/workspaces/w/experiments/e/jobs/j-1",
         "/files/a b/c%20d", "/x/ü/✓", "/q?state=running&x=a b", "/a/[b]/{c}/`d`/<e>|f^g",
         "/semi;colon/at@/plus+/eq=/comma,/dollar$/amp&", "/hash#frag", "/tilde~/'quote'",
         '/quote"d']
PARAMS: list[dict[str, Any] | None] = [
    None, {}, {"limit": 1000, "cursor": "abc=="}, {"state": "running", "all": True,
                                                    "mine": False, "none": None},
    {"q": "a b&c=d/e?f#g", "u": "ü✓", "many": ["x", "y z", 3]}, {"plus": "+", "tilde": "~*"},
]


@pytest.mark.parametrize("prefix", ["/", "/api", "/api/v1/"])
@pytest.mark.parametrize("path", PATHS)
def test_targets_are_httpx_targets(prefix: str, path: str) -> None:
    base = f"http://127.0.0.1:8080{prefix}"
    for params in PARAMS:
        if "?" in path and params is not None:
            continue
        request = httpx.Client(base_url=base).build_request("GET", path, params=params)
        assert target(prefix, path, params) == request.url.raw_path.decode("ascii"), \
            (prefix, path, params)


def test_the_cases_that_differ() -> None:
    assert target("/", "/q?a=1", {"b": 2}) == "/q?a=1&b=2"
    assert target("/api", "/a/./b/../c", None) == "/api/a/./b/../c"
    from batchyard import errors
    from batchyard.client.http import checked_path

    with pytest.raises(errors.SpecError):
        checked_path("/a/./b/../c")


def test_query_strings_and_json_bodies() -> None:
    assert query_string({"a": True, "b": [1, 2], "c": None}) == "a=true&b=1&b=2&c="
    for value in [{"a": "ü✓", "b": [1, 2.5, None, True]}, [], "x", {"nested": {"k": "\n"}}]:
        request = httpx.Request("POST", "http://h/", json=value)
        assert json_body(value) == request.content, value
        assert json.loads(json_body(value)) == value
    with pytest.raises(ValueError):
        json_body({"nan": float("nan")})
