"""The ``[use_case.sfp]`` table (``schemas/config.py``): Apple's §6.1 defaults for both halves,
the derived ``<name>.fragments`` use case, overrides, and every refusal with its fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ldpipe.schemas.config import parse_config
from ldpipe.schemas.config_checks import ConfigError
from ldpipe.schemas.config_tables import ShuffleConfig, Topics
from ldpipe.schemas.discovery.sfp_wire import fragment_wire_mechanism
from ldpipe.schemas.discovery.sfp_words import SfpParams
from ldpipe.schemas.mechanisms.params import mechanism_params

SFP = """
[[use_case]]
name = "newwords"
[use_case.sfp]
"""

SHARED = """
[[use_case]]
name = "newwords"
epoch = 3
public_key = "keys/newwords-3.public.json"
private_keys = ["keys"]
[use_case.topics]
partitions = 4
[use_case.shuffle]
n_min = 500
max_reports = 5000
contribution_limit = 1
[use_case.snapshot]
directory = "snap/nw"
window_seconds = 86400
keep_windows = 7
[use_case.sfp]
"""


def test_defaults_are_apples_deployment_for_both_halves() -> None:
    cfg = parse_config(SFP, base=Path("/srv"))
    word, fragments = cfg.use_cases
    assert (word.name, fragments.name) == ("newwords", "newwords.fragments")
    assert cfg.declared == (word,)
    assert not word.derived and fragments.derived
    assert word.sfp is not None and fragments.sfp is not None
    assert (word.sfp.role, fragments.sfp.role) == ("word", "fragments")
    for half in (word.sfp, fragments.sfp):
        assert (half.word_use_case, half.fragments_use_case) == ("newwords", "newwords.fragments")
        assert half.threshold is None and half.store is None

    # Apple §6.1: word sketch cms, eps = 2, k = 2048, m = 1024 ...
    assert (word.mechanism_name, word.epsilon) == ("cms", 2.0)
    assert (word.mechanism.k, word.mechanism.m) == (2048, 1024)
    # ... fragment sketches cms, eps' = 6, k' = 2048, m' = 1024, one block per position
    params = word.sfp_params
    assert params == fragments.sfp_params
    assert params == SfpParams()  # Apple's deployment, word family included
    assert params.total_epsilon == pytest.approx(8.0)
    assert (fragments.mechanism_name, fragments.epsilon) == ("cms", 6.0)
    assert (fragments.mechanism.k, fragments.mechanism.m) == (5 * 2048, 1024)
    # each half's mechanism is what the puzzle expects in its snapshots (discovery/sfp_service.py)
    assert mechanism_params(word.mechanism) == mechanism_params(params.word_oracle())
    assert mechanism_params(fragments.mechanism) == mechanism_params(
        fragment_wire_mechanism(params)
    )
    assert fragments.topics == Topics(
        reports="ldp.newwords.fragments.reports",
        shuffled="ldp.newwords.fragments.shuffled",
        dlq="ldp.newwords.fragments.dlq",
        shuffler_state="ldp.newwords.fragments.shuffler-state",
        params="ldp.newwords.fragments.params",
        partitions=1,
    )
    assert word.topics.reports == "ldp.newwords.reports"
    assert fragments.snapshot.directory == Path("/srv/snapshots/newwords/fragments")
    assert fragments.dictionary is None and fragments.discovery is None


def test_fragments_share_keys_epoch_partitions_shuffle_and_snapshot_settings() -> None:
    cfg = parse_config(SHARED, base=Path("/etc/ldpipe"))
    word, fragments = cfg.use_cases
    assert fragments.private_keys == word.private_keys == (Path("/etc/ldpipe/keys"),)
    assert fragments.public_key == word.public_key
    assert fragments.epoch == word.epoch == 3
    assert fragments.topics.partitions == word.topics.partitions == 4
    assert fragments.shuffle == word.shuffle == ShuffleConfig(n_min=500, max_reports=5000)
    assert fragments.snapshot == replace(
        word.snapshot, directory=Path("/etc/ldpipe/snap/nw/fragments")
    )
    assert fragments.snapshot.window_seconds == 86400 and fragments.snapshot.keep_windows == 7
    assert fragments.base_epoch().epoch == 3


def test_overrides() -> None:
    cfg = parse_config(
        """
[[use_case]]
name = "nw"
mechanism = "hcms"
epsilon = 1.5
k = 128
m = 512
hash_seed = 77
[use_case.sfp]
epsilon_fragment = 4.0
fragment_mechanism = "hcms"
fragment_k = 64
fragment_m = 256
fragment_hash_seed = 9
word_length = 8
fragment_length = 4
alphabet = "abcd"
pad = "_"
lowercase = false
piece_bits = 6
fragment_z = 5
word_z = 3.5
fragment_top = 100
max_words_per_piece = 10
threshold = 300
store = "found"
[use_case.sfp.topics]
reports = "frag.in"
shuffled = "frag.out"
""",
        base=Path("/etc/ldpipe"),
    )
    word, fragments = cfg.use_cases
    assert word.sfp is not None and fragments.sfp is not None
    params = word.sfp_params
    assert params == fragments.sfp_params
    assert params == SfpParams(
        epsilon_fragment=4.0,
        epsilon_word=1.5,
        word_length=8,
        fragment_length=4,
        piece_bits=6,
        alphabet="abcd",
        pad="_",
        lowercase=False,
        fragment_mechanism="hcms",
        fragment_k=64,
        fragment_m=256,
        fragment_hash_seed=9,
        word_mechanism="hcms",
        word_k=128,
        word_m=512,  # hcms: a power of two
        word_hash_seed=77,
        fragment_z=5.0,
        word_z=3.5,
        fragment_top=100,
        max_words_per_piece=10,
    )
    assert params.positions == 2
    assert (word.mechanism_name, word.mechanism.k, word.mechanism.m) == ("hcms", 128, 512)
    assert (fragments.mechanism_name, fragments.epsilon) == ("hcms", 4.0)
    assert (fragments.mechanism.k, fragments.mechanism.m) == (2 * 64, 256)
    assert word.sfp.threshold == fragments.sfp.threshold == 300.0
    assert word.sfp.store == fragments.sfp.store == Path("/etc/ldpipe/found")  # base-relative
    assert (fragments.topics.reports, fragments.topics.shuffled) == ("frag.in", "frag.out")
    assert fragments.topics.dlq == "ldp.nw.fragments.dlq"  # the keys not given keep defaults


def test_absolute_store_and_an_explicit_word_sketch() -> None:
    cfg = parse_config(
        SFP.replace('"newwords"', '"nw"\nepsilon = 3.0\nk = 256\nm = 128')
        + 'store = "/var/lib/sfp"\n',
        base=Path("/etc"),
    )
    word = cfg.use_case("nw")
    assert word.sfp is not None and word.sfp.store == Path("/var/lib/sfp")
    assert (word.sfp_params.epsilon_word, word.sfp_params.word_k, word.sfp_params.word_m) == (
        3.0,
        256,
        128,
    )


def test_enabled_false_keeps_a_plain_use_case() -> None:
    plain = """
[[use_case]]
name = "nw"
mechanism = "cms"
epsilon = 1.0
[use_case.sfp]
enabled = false
fragment_k = 64
"""
    cfg = parse_config(plain)
    (uc,) = cfg.use_cases
    assert uc.sfp is None and not uc.derived and cfg.declared == (uc,)
    assert (uc.mechanism.k, uc.mechanism.m) == (1024, 1024)  # not the SFP word sketch
    with pytest.raises(ConfigError, match=r"use_case.nw: not an SFP use case; add a \[use_case"):
        _ = uc.sfp_params
    # a disabled table does not supply Apple's word-sketch defaults
    with pytest.raises(ConfigError, match=r"use_case.nw.mechanism: missing; add `mechanism = "):
        parse_config(SFP.replace('"newwords"', '"nw"') + "enabled = false\n")
    # and is still checked for typos, like a disabled [use_case.discovery]
    with pytest.raises(ConfigError, match=r"use_case.nw.sfp: unknown key\(s\) fragmnt_k"):
        parse_config(plain.replace("fragment_k", "fragmnt_k"))


NAME_42 = "a" * 42
DISCOVERY = '[use_case.discovery]\nepsilon = 2.0\ndelta = 1e-9\ntag_key = "tag.key"\n'
TOPIC_CLASHES = (  # (key of [use_case.sfp.topics], the word topic it reuses)
    ("reports", "reports"),
    ("shuffled", "shuffled"),
    ("dlq", "dlq"),
    ("reports", "shuffled"),
    ("shuffler_state", "shuffler-state"),  # would count a device's two reports together
    ("params", "params"),
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            SFP.replace("newwords", NAME_42),
            rf"use_case.{NAME_42}.sfp: the fragments use case '{NAME_42}.fragments' needs a name "
            r"of at most 51 characters; shorten the use case name to 41 characters or fewer",
            id="name-too-long",
        ),
        pytest.param(
            SFP + DISCOVERY,
            r"use_case.newwords: \[use_case.sfp\] and \[use_case.discovery\] are two discovery "
            r"protocols .*; enable one per use case",
            id="with-discovery",
        ),
        pytest.param(
            SFP.replace('"newwords"', '"newwords"\nmechanism = "rrcms"'),
            r"use_case.newwords.mechanism: SFP's word report is a cms or hcms report .*got "
            r"'rrcms'; set mechanism = \"cms\" or \"hcms\"",
            id="mechanism-rrcms",
        ),
        pytest.param(
            SFP.replace('"newwords"', '"newwords"\nmechanism = "oue"'),
            r"use_case.newwords.mechanism: SFP's word report is a cms or hcms report .*got "
            r"'oue'; set mechanism = \"cms\" or \"hcms\"",
            id="mechanism-oue",
        ),
        pytest.param(
            SFP.replace('"newwords"', '"newwords"\nmechanism = "hcms"\nm = 1000'),
            r"use_case.newwords: hcms needs m to be a power of two .*use m=1024",
            id="word-hcms-m",
        ),
        pytest.param(
            SFP + "word_length = 9\n",
            r"use_case.newwords.sfp: word_length \(9\) must be a multiple of fragment_length "
            r"\(2\) so the fragments tile the word",
            id="word-length",
        ),
        pytest.param(
            SFP + "piece_bits = 9\n",
            r"use_case.newwords.sfp: piece_bits must be in \[1, 8\], got 9",
            id="piece-bits",
        ),
        pytest.param(
            SFP + 'fragment_mechanism = "oue"\n',
            r"use_case.newwords.sfp: fragment_mechanism must be 'cms' or 'hcms', got 'oue'",
            id="fragment-mechanism",
        ),
        pytest.param(
            SFP + 'fragment_mechanism = "hcms"\nfragment_m = 1000\n',
            r"use_case.newwords.sfp: SFP fragment sketch \(hcms, k=2048, m=1000\): .*power of two",
            id="fragment-hcms-m",
        ),
        pytest.param(
            SFP + "epsilon_fragment = 0.0\n",
            r"use_case.newwords.sfp: epsilon_fragment must be a positive finite number, got 0.0",
            id="epsilon-fragment",
        ),
        pytest.param(
            SFP + "word_z = -1.0\n",
            r"use_case.newwords.sfp: word_z must be a positive finite number",
            id="word-z",
        ),
        pytest.param(
            SFP + 'alphabet = "abc "\n',
            r"use_case.newwords.sfp: alphabet must list distinct characters and not the pad",
            id="alphabet-with-pad",
        ),
        pytest.param(
            SFP + "fragment_length = 5\nword_length = 10\nalphabet = 'abcdefghij'\n",
            r"use_case.newwords.sfp: .* candidates per position is above .*; use fewer "
            r"piece_bits, a smaller alphabet or shorter fragments",
            id="candidates",
        ),
        pytest.param(
            SFP + "fragment_k = 1048576\n",
            r"use_case.newwords.sfp: a sketch of k=5242880 x m=1024 cells exceeds 2\^31 - 1 "
            r"cells .*; lower k or m",
            id="cells",
        ),
        pytest.param(
            SFP + "epsilon_word = 3.0\n",
            r"use_case.newwords.sfp: unknown key\(s\) epsilon_word; allowed: alphabet, enabled,",
            id="unknown-key",
        ),
        pytest.param(
            SFP + 'fragment_k = "big"\n',
            r"use_case.newwords.sfp.fragment_k: expected int, got str",
            id="type-int",
        ),
        pytest.param(
            SFP + "lowercase = 1\n",
            r"use_case.newwords.sfp.lowercase: expected bool, got int 1",
            id="type-bool",
        ),
        pytest.param(
            SFP + "enabled = 'no'\n",
            r"use_case.newwords.sfp.enabled: expected bool, got str",
            id="type-enabled",
        ),
        pytest.param(
            SFP + "threshold = -1.0\n",
            r"use_case.newwords.sfp.threshold: must be > 0 and finite",
            id="threshold",
        ),
        pytest.param(
            SFP + "store = 3\n",
            r"use_case.newwords.sfp.store: expected str, got int 3",
            id="store",
        ),
        pytest.param(
            SFP.replace("[use_case.sfp]", "sfp = 1"),
            r"use_case.newwords.sfp: expected dict, got int 1",
            id="not-a-table",
        ),
        pytest.param(
            SFP + "[use_case.sfp.topics]\npartitions = 3\n",
            r"use_case.newwords.sfp.topics: unknown key\(s\) partitions; allowed: dlq, params, "
            r"reports, shuffled, shuffler_state",
            id="topics-partitions",
        ),
        *(
            pytest.param(
                SFP + f'[use_case.sfp.topics]\n{key} = "ldp.newwords.{topic}"\n',
                rf"use_case.newwords.sfp.topics: ldp.newwords.{topic} is also a topic of the word "
                r"reports; the fragment reports need topics of their own",
                id=f"clash-{key}-{topic}",
            )
            for key, topic in TOPIC_CLASHES
        ),
        pytest.param(
            SFP + '[[use_case]]\nname = "newwords.fragments"\nmechanism = "cms"\nepsilon = 1.0\n',
            r"use_case: duplicate name\(s\) newwords.fragments; names must be unique",
            id="declared-fragments-name",
        ),
    ],
)
def test_errors_name_the_field_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text)
