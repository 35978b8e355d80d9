from __future__ import annotations

from pathlib import Path

import pytest

from ldpipe.schemas.config import load_config, parse_config
from ldpipe.schemas.config_checks import ConfigError

MINIMAL = """
[[use_case]]
name = "emoji"
mechanism = "cms"
epsilon = 4.0
k = 64
m = 64
"""


def test_example_configuration_is_valid() -> None:
    cfg = load_config(Path(__file__).parents[2] / "infra" / "example.toml")
    uc = cfg.use_case("emoji")
    assert uc.mechanism.name == "cms" and uc.mechanism.k == 1024
    assert uc.topics.partitions == 2 and uc.topics.dlq == "ldp.emoji.dlq"
    assert uc.dictionary_items is not None and "GRINNING FACE" in uc.dictionary_items
    assert uc.private_keys[0].name == "keys" and uc.public_key is not None
    assert uc.public_key.name == "emoji-1.public.json"


def test_defaults() -> None:
    uc = parse_config(MINIMAL, base=Path("/srv")).use_case("emoji")
    assert uc.epoch == 1 and uc.shuffle.n_min == 1000
    assert uc.snapshot.directory == Path("/srv/snapshots/emoji")
    assert uc.topics.reports == "ldp.emoji.reports"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[use_case]]\nname='x'\nmechanism='cms'\n", r"use_case.x.epsilon: missing"),
        (MINIMAL + "colour = 'red'\n", r"use_case.emoji: unknown key\(s\) colour"),
        (MINIMAL.replace("epsilon = 4.0", "epsilon = 'high'"), r"epsilon: expected float"),
        (MINIMAL.replace("'cms'", "'rappor'").replace('"cms"', '"rappor"'), "unknown; use one of"),
        (MINIMAL + "[use_case.shuffle]\nn_min = 0\n", r"shuffle.n_min: must be > 0"),
        (
            MINIMAL + "[use_case.shuffle]\nn_min = 100\nmax_reports = 10\n",
            "max_reports: 10 is below n_min=100",
        ),
        (MINIMAL.replace("m = 64", "m = 64\np = 0.9"), "use_case.emoji: cms does not take p"),
        (MINIMAL.replace('"emoji"', '"Emoji!"'), "must be 1-51 of"),
        (MINIMAL + MINIMAL, "duplicate name"),
        ("", "no \\[\\[use_case\\]\\] tables"),
        ("[[use_case]\n", "not valid TOML"),
        ("[kafka]\nbootstrap = 'x'\n", r"kafka: unknown key\(s\) bootstrap"),
    ],
)
def test_errors_name_the_field_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text)


def test_missing_file() -> None:
    with pytest.raises(
        ConfigError, match=r"does not exist; `ldpipe init DIR` writes a working one"
    ):
        load_config("/nonexistent/ldpipe.toml")


def test_kafka_extra_passthrough() -> None:
    cfg = parse_config('[kafka]\nextra = { "security.protocol" = "SSL", "x" = true }\n' + MINIMAL)
    assert cfg.kafka.extra == {"security.protocol": "SSL", "x": "true"}


def test_sfp_example_configuration_is_valid() -> None:
    cfg = load_config(Path(__file__).parents[2] / "infra" / "sfp-example.toml")
    word, fragments = cfg.use_cases
    assert cfg.declared == (word,) and fragments.derived
    params = word.sfp_params
    assert (params.epsilon_word, params.epsilon_fragment, params.word_k, params.fragment_k) == (
        2.0,
        6.0,
        2048,
        2048,
    )
    assert fragments.snapshot.directory == word.snapshot.directory / "fragments"
    assert fragments.mechanism.k == 5 * 2048 and fragments.public_key == word.public_key
