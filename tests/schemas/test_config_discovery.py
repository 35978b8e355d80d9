"""``[use_case.discovery]`` (schemas/config_discovery.py): every refusal names the field
and the fix; the defaults are the ones docs/discovery.md documents."""

from __future__ import annotations

from pathlib import Path

import pytest

from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_discovery import DiscoverySettings, DiscoveryTopics
from ldpipe.schemas.discovery.layers import MAX_DISCOVERY_USE_CASE_LENGTH

BASE = Path("/etc/ldpipe")
TARGET = 'epsilon = 2.0\ndelta = 1e-9\ntag_key = "tag.key"\n'
W = r"use_case\.words\.discovery"


def settings(body: str, *, name: str = "words") -> DiscoverySettings | None:
    text = f"""
[[use_case]]
name = "{name}"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
[use_case.discovery]
{body}"""
    return parse_config(text, base=BASE).use_case(name).discovery


def refused(body: str, message: str, *, name: str = "words") -> None:
    with pytest.raises(ConfigError, match=message):
        settings(body, name=name)


# ---- defaults ----------------------------------------------------------------------------------
def test_defaults() -> None:
    d = settings(TARGET)
    assert d is not None
    assert d.topics == DiscoveryTopics(
        reports="ldp.words.discovery.reports",
        shuffled="ldp.words.discovery.shuffled",
        released="ldp.words.discovery.released",
        dlq="ldp.words.discovery.dlq",
        shuffler_state="ldp.words.discovery.shuffler-state",
    )
    assert (d.epsilon, d.delta, d.threshold, d.laplace_scale) == (2.0, 1e-9, None, None)
    assert d.neighbours == "replace-one" and d.epoch == 1
    assert (d.max_bytes, d.mode, d.lowercase) == (64, "text", False)
    assert d.store is None  # the server then uses <snapshot directory>/discoveries
    assert d.tag_key == BASE / "tag.key" and d.tag_keys == ()
    assert d.aux_public_key is None and d.aux_private_keys == ()


def test_no_table_or_disabled_is_none() -> None:
    text = '[[use_case]]\nname = "words"\nmechanism = "cms"\nepsilon = 4.0\nk = 64\nm = 64\n'
    assert parse_config(text, base=BASE).use_case("words").discovery is None
    assert settings(TARGET + "enabled = false\n") is None
    assert settings("enabled = false\n") is None  # a disabled table is not validated further
    assert settings(TARGET + "enabled = true\n") is not None


def test_relative_paths_resolve_against_base_and_absolute_ones_stay() -> None:
    d = settings(
        'threshold = 21.0\nlaplace_scale = 1.0\ntag_key = "keys/tag/words-2.tag.json"\n'
        'tag_keys = ["keys/old", "/secure/words-1.tag.json"]\n'
        'aux_public_key = "aux/aux-1.public.json"\n'
        'aux_private_keys = "aux"\n'
        'store = "discoveries"\n'
    )
    assert d is not None
    assert d.tag_key == BASE / "keys/tag/words-2.tag.json"
    assert d.tag_keys == (BASE / "keys/old", Path("/secure/words-1.tag.json"))
    assert d.aux_public_key == BASE / "aux/aux-1.public.json"
    assert d.aux_private_keys == (BASE / "aux",)  # one path or a list
    assert d.store == BASE / "discoveries"
    assert (d.threshold, d.laplace_scale, d.epsilon, d.delta) == (21.0, 1.0, None, None)
    absolute = settings('threshold = 21.0\nlaplace_scale = 1.0\ntag_key = "/k/t.tag.json"\n')
    assert absolute is not None and absolute.tag_key == Path("/k/t.tag.json")


def test_tag_keys_takes_one_path_or_a_list() -> None:
    d = settings(TARGET + 'tag_keys = "old-keys"\n')
    assert d is not None and d.tag_keys == (BASE / "old-keys",)


def test_explicit_settings_are_kept() -> None:
    d = settings(
        TARGET + 'neighbours = "add-remove"\nepoch = 7\nmax_bytes = 128\nmode = "url"\n'
        "lowercase = true\n"
        '[use_case.discovery.topics]\nreleased = "words-released"\ndlq = "words-dlq"\n'
    )
    assert d is not None
    assert (d.neighbours, d.epoch, d.max_bytes, d.mode, d.lowercase) == (
        "add-remove",
        7,
        128,
        "url",
        True,
    )
    assert d.topics.released == "words-released" and d.topics.dlq == "words-dlq"
    assert d.topics.reports == "ldp.words.discovery.reports"


# ---- refusals ----------------------------------------------------------------------------------
def test_unknown_key_names_it_and_the_allowed_ones() -> None:
    refused(TARGET + "colour = 1\n", rf"{W}: unknown key\(s\) colour; allowed: .*tag_keys")


def test_both_pairs_refused() -> None:
    refused(
        TARGET + "threshold = 21.0\nlaplace_scale = 1.0\n",
        rf"{W}: give either threshold and laplace_scale \(T, b\) or epsilon and delta .* not "
        r"both and not one of a pair",
    )


@pytest.mark.parametrize(
    "pair",
    [
        "threshold = 21.0\n",
        "laplace_scale = 1.0\n",
        "epsilon = 2.0\n",
        "delta = 1e-9\n",
        "epsilon = 2.0\ndelta = 1e-9\nthreshold = 21.0\n",  # one pair and half of the other
    ],
)
def test_one_of_a_pair_refused(pair: str) -> None:
    refused(pair + 'tag_key = "tag.key"\n', rf"{W}: give either .*not one of a pair")


def test_neither_pair_refused() -> None:
    refused('tag_key = "tag.key"\n', rf"{W}: give either threshold and laplace_scale")


@pytest.mark.parametrize(
    ("pair", "message"),
    [
        ("epsilon = 2.0\ndelta = 1.0\n", r"delta must be < 1/2, got 1\.0"),
        ("epsilon = 2.0\ndelta = 0.5\n", r"delta must be < 1/2"),
        ("epsilon = 2.0\ndelta = 0.0\n", r"delta must be > 0 .*delta = 0 is impossible"),
        ("epsilon = 0.0\ndelta = 1e-9\n", r"epsilon must be in \(0, 700\]"),
        ("epsilon = 800.0\ndelta = 1e-9\n", r"epsilon must be in \(0, 700\]"),
        ("threshold = 21.0\nlaplace_scale = 0.0\n", r"the Laplace scale b must be > 0"),
        ("threshold = 21.0\nlaplace_scale = -1.0\n", r"the Laplace scale b must be > 0"),
        ("threshold = 1.0\nlaplace_scale = 1.0\n", r"the threshold T must be > 1.*parameters_for"),
    ],
)
def test_settings_without_privacy_refused(pair: str, message: str) -> None:
    refused(pair + 'tag_key = "tag.key"\n', rf"{W}: {message}")


def test_large_delta_for_replace_one_refused() -> None:
    # 1 - e^(-eps/2) = 0.0488 at eps = 0.1: delta 0.1 is below 1/2 but gives no privacy
    refused('epsilon = 0.1\ndelta = 0.1\ntag_key = "t"\n', rf"{W}: delta 0\.1 is above 1 - e")


def test_unknown_neighbours_refused() -> None:
    refused(
        TARGET + 'neighbours = "swap"\n',
        rf"{W}\.neighbours: 'swap' unknown; use one of \('replace-one', 'add-remove'\)",
    )


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ("max_bytes = 0\n", r"max_bytes must be an integer in \[1, \d+\], got 0; every report"),
        ("max_bytes = 100000\n", r"max_bytes must be an integer in \[1, \d+\], got 100000"),
        ('mode = "html"\n', r"mode must be 'text' or 'url', got 'html'"),
        ('max_bytes = "64"\n', r"\.max_bytes: expected int, got str '64'"),
        ('lowercase = "yes"\n', r"\.lowercase: expected bool, got str 'yes'"),
    ],
)
def test_bad_item_rules_refused(rule: str, message: str) -> None:
    refused(TARGET + rule, rf"{W}.*{message}")


@pytest.mark.parametrize("epoch", [-1, 2**32])
def test_epoch_out_of_range_refused(epoch: int) -> None:
    refused(TARGET + f"epoch = {epoch}\n", rf"{W}\.epoch: must be in \[0, 2\^32\), got {epoch}")


def test_use_case_name_too_long_for_discovery() -> None:
    name = "w" * (MAX_DISCOVERY_USE_CASE_LENGTH + 1)  # a legal use case name (<= 51)
    refused(
        TARGET,
        rf"use_case\.{name}\.discovery: the use case name '{name}' is longer than "
        rf"{MAX_DISCOVERY_USE_CASE_LENGTH} characters.*; shorten the name",
        name=name,
    )
    ok = settings(TARGET, name="w" * MAX_DISCOVERY_USE_CASE_LENGTH)
    assert ok is not None


def test_topics_table_unknown_key_refused() -> None:
    refused(
        TARGET + '[use_case.discovery.topics]\nreleased = "r"\nledger = "l"\n',
        rf"{W}\.topics: unknown key\(s\) ledger; allowed: dlq, released, reports, shuffled, "
        r"shuffler_state",
    )


def test_tag_key_missing_or_a_list_refused() -> None:
    refused("epsilon = 2.0\ndelta = 1e-9\n", rf"{W}\.tag_key: missing; add `tag_key = \.\.\.`")
    refused(
        'epsilon = 2.0\ndelta = 1e-9\ntag_key = ["a", "b"]\n',
        rf"{W}\.tag_key: expected one path, the key devices tag with now; list the older keys "
        r"the server still accepts in tag_keys",
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("tag_keys = 3\n", r"\.tag_keys: expected a path or a list of paths"),
        ('tag_keys = ["a", 1]\n', r"\.tag_keys: expected a path or a list of paths"),
        ("aux_private_keys = 3\n", r"\.aux_private_keys: expected a path or a list of paths"),
        ('aux_public_key = ["a"]\n', r"\.aux_public_key: expected one path"),
        ("store = 3\n", r"\.store: expected str, got int 3"),
        ('enabled = "no"\n', r"\.enabled: expected bool, got str 'no'"),
        ('epsilon = "two"\ndelta = 1e-9\n', r"\.epsilon: expected float, got str 'two'"),
    ],
)
def test_bad_types_refused(entry: str, message: str) -> None:
    body = entry if "epsilon" in entry else TARGET + entry
    if "tag_key =" not in body:
        body += 'tag_key = "tag.key"\n'
    refused(body, rf"{W}{message}")


def test_discovery_must_be_a_table() -> None:
    text = (
        '[[use_case]]\nname = "words"\nmechanism = "cms"\nepsilon = 4.0\nk = 64\nm = 64\n'
        "discovery = true\n"
    )
    with pytest.raises(ConfigError, match=r"use_case\.words\.discovery: expected dict, got bool"):
        parse_config(text, base=BASE)
