"""eagle_zoo.tools.openers (`eagle-zoo openers`): request openers for
`eagle-zoo train prompts --openers-file`."""
from __future__ import annotations

import pytest

from eagle_zoo.cli import main as cli_main


@pytest.fixture(scope="module")
def topic_openers():
    from eagle_zoo.tools import openers

    return openers


def openers_cli(*args: str) -> int:
    return cli_main(["openers", *args])


def test_free_rows_fall_every_nth_line(topic_openers):
    lines = topic_openers.build(300, free_every=3, seed=0)
    assert len(lines) == 300
    assert [i for i, line in enumerate(lines) if line == "*"] == list(range(2, 300, 3))
    assert "*" not in topic_openers.build(50, free_every=0, seed=0)


def test_seeded_and_spread_over_subjects(topic_openers):
    a, b = topic_openers.build(3000, 3, seed=1), topic_openers.build(3000, 3, seed=1)
    assert a == b and a != topic_openers.build(3000, 3, seed=2)
    raw = [t.strip() for field in topic_openers.TOPICS.values() for t in field.split(",")]
    assert all(raw) and len(set(raw)) == len(raw)  # no empty or repeated subject in the lists
    topics = topic_openers.subjects()
    assert topics == raw
    subject_lines = [line for line in a if any(t in line for t in topics)]
    # subject requests do not repeat until the subject x frame pairs run out
    assert len(subject_lines) > 1000 and len(set(subject_lines)) >= 0.95 * len(subject_lines)
    fields_seen = {field for field, names in topic_openers.TOPICS.items()
                   if any(t.strip() in line for t in names.split(",") for line in subject_lines)}
    assert fields_seen == set(topic_openers.TOPICS)
    assert {"{", "}"}.isdisjoint("".join(a))  # every frame filled


def test_cli_writes_lines(topic_openers, capsys):
    assert openers_cli("--num", "7", "--free-every", "2", "--seed", "4") == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 7 and out[1::2] == ["*"] * 3 and all(line.strip() == line and line for line in out)
    with pytest.raises(SystemExit, match=r"eagle-zoo openers: --num 0: must be at least 1"):
        openers_cli("--num", "0")


def test_constraints_end_whole_requests_only(topic_openers):
    """--constraint-share: that share of the subject requests whose frame is a whole
    request ends with one of CONSTRAINTS; frames that the target must finish never do, and
    the share leaves every other line as it was."""
    plain = topic_openers.build(3000, 3, seed=5)
    steered = topic_openers.build(3000, 3, seed=5, constraint_share=0.5)
    assert len(plain) == len(steered)
    changed = [(a, b) for a, b in zip(plain, steered) if a != b]
    assert changed
    for a, b in changed:
        head, _, tail = b.partition(". ")
        assert head == a and tail in topic_openers.CONSTRAINTS
        # a whole request, not a start the target must finish ("Compare X and", "In the field of X,")
        assert a[-1] not in ",.:?" and a.split()[-1] not in {"and", "with", "on", "of"}
    whole_requests = {f.format(t=t) for f in topic_openers.TOPIC_FRAMES if topic_openers.takes_constraint(f)
                      for t in topic_openers.subjects()}
    whole = [a for a in plain if a in whole_requests]
    assert 0.4 < len(changed) / len(whole) < 0.6
    takes = {f for f in topic_openers.TOPIC_FRAMES if topic_openers.takes_constraint(f)}
    assert {"Discuss {t}", "Write a poem about {t}"} <= takes
    assert takes.isdisjoint({"Describe how {t}", "Compare {t} and", "What is {t}", "Explain {t} to a ten-year-old"})
    with pytest.raises(SystemExit, match=r"--constraint-share 1.5: must be within 0-1"):
        openers_cli("--constraint-share", "1.5")


def test_starter_share_moves_lines_from_subjects_to_starters(topic_openers):
    """--starter-share: code, math and extraction starters in place of subject requests;
    role play keeps its tenth."""
    starters, roles = set(topic_openers.STARTERS), {f.format(r=r) for f in topic_openers.ROLE_FRAMES
                                                    for r in topic_openers.ROLES}
    for share in (0.25, 0.5):
        lines = topic_openers.build(6000, 0, seed=3, starter_share=share)
        assert abs(sum(line in starters for line in lines) / len(lines) - share) < 0.03
        assert abs(sum(line in roles for line in lines) / len(lines) - 0.1) < 0.02
    with pytest.raises(SystemExit, match=r"--starter-share 0.95: must be within 0-0.9"):
        openers_cli("--starter-share", "0.95")
