# SPDX-License-Identifier: LGPL-3.0-only
"""The #DW grammar: splitting, per-command rules, job-wide rules, sizes; plus properties."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.base.errors import DirectiveError
from flux_dws.core.directives import (
    COMMANDS,
    TEST_COMMANDS,
    Directive,
    parse_directives,
    parse_size,
    split_directives,
    words,
)
from flux_dws.core.states import State

XFS = "#DW jobdw type=xfs capacity=10GiB name=scratch"
GFS2 = "#DW jobdw type=gfs2 capacity=100GB name=my-gfs2"


def error_of(value) -> str:
    with pytest.raises(DirectiveError) as info:
        parse_directives(value)
    return str(info.value)


def assert_error(value, index: int, command: str, *parts: str) -> str:
    """The error names the directive index and command first, then every part given."""
    message = error_of(value)
    prefix = f"#DW directive {index} ({command}): " if command else f"#DW directive {index}: "
    assert message.startswith(prefix), message
    for part in parts:
        assert part in message, (part, message)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------- splitting


def test_split_newlines_and_several_on_one_line():
    copy = "#DW   copy_in\tsource=/lus/a  destination=$DW_JOB_scratch/a"
    text = f"  {XFS}\n\n{copy} #DW PreRun action=wait"
    assert split_directives(text) == (
        XFS,
        "#DW copy_in source=/lus/a destination=$DW_JOB_scratch/a",
        "#DW PreRun action=wait",
    )


def test_split_list_elements_may_hold_several_and_blank_elements_are_skipped():
    value = [f"{XFS} #DW PreRun action=wait", "", "#DW DataIn action=wait"]
    assert split_directives(value) == (XFS, "#DW PreRun action=wait", "#DW DataIn action=wait")
    assert split_directives(tuple(value)) == split_directives(value)


@pytest.mark.parametrize("value", ["", "  \n\t", [], ["", " "]])
def test_split_empty_input_is_an_error(value):
    with pytest.raises(DirectiveError, match="no #DW directives given"):
        split_directives(value)


def test_split_words_before_the_first_dw_name_the_directive_index():
    with pytest.raises(DirectiveError, match=r"^#DW directive 1: 'jobdw type=xfs' does not start"):
        split_directives([XFS, "jobdw type=xfs"])
    with pytest.raises(DirectiveError, match=r"^#DW directive 0: .*in upper case"):
        split_directives("#dw jobdw type=xfs")


@pytest.mark.parametrize("value", [None, 3, b"#DW jobdw", {"#DW": 1}])
def test_split_rejects_non_text(value):
    with pytest.raises(DirectiveError, match="string"):
        split_directives(value)


def test_split_rejects_a_non_string_element_by_index():
    with pytest.raises(DirectiveError, match=r"^#DW directive 1: expected a string, not int"):
        split_directives([XFS, 7])


# ---------------------------------------------------------------------------- Directive


def test_parse_gives_index_command_args_in_order_text_and_name():
    (d,) = parse_directives("#DW  jobdw name=scratch   capacity=10GiB type=xfs")
    assert d.index == 0 and d.command == "jobdw" and d.name == "scratch"
    assert list(d.args.items()) == [("name", "scratch"), ("capacity", "10GiB"), ("type", "xfs")]
    assert d.text == "#DW jobdw name=scratch capacity=10GiB type=xfs"
    assert d.args.get("profile") is None and not d.is_test


def test_directive_is_hashable_and_its_args_read_only():
    (d,) = parse_directives(XFS)
    built = Directive(0, "jobdw", {"type": "xfs", "capacity": "10GiB", "name": "scratch"}, XFS)
    assert built == d and hash(built) == hash(d) and len({d, built}) == 1
    with pytest.raises(TypeError):
        d.args["name"] = "other"  # type: ignore[index]
    assert parse_directives("#DW PreRun action=wait")[0].name is None


def test_value_keeps_everything_after_the_first_equals_sign():
    (_, d) = parse_directives([XFS, "#DW copy_out source=$DW_JOB_scratch/a=b destination=/l/x=y"])
    assert d.args["source"] == "$DW_JOB_scratch/a=b" and d.args["destination"] == "/l/x=y"


# ---------------------------------------------------------------------------- words


def test_missing_command():
    assert_error(f"{XFS} #DW", 1, "", "missing command after #DW")


def test_unknown_command_lists_known_ones_or_suggests_the_spelling():
    message = assert_error("#DW stage_in source=/a", 0, "", "unknown command 'stage_in'")
    assert all(command in message for command in (*COMMANDS, *TEST_COMMANDS))
    assert_error("#DW JobDW type=xfs", 0, "", "did you mean jobdw?")
    assert_error("#DW prerun action=wait", 0, "", "did you mean PreRun?")


@pytest.mark.parametrize(
    "word, problem",
    [
        ("profile", "word 'profile' is not key=value"),
        ("=x", "word '=x' has an empty key"),
        ("profile=", "key 'profile' has an empty value"),
        ("name=other", "key 'name' is given twice"),
        ("color=red", "unknown key 'color': jobdw takes type, capacity, name, profile, requires"),
    ],
)
def test_bad_words(word, problem):
    assert_error(f"{GFS2} {XFS} {word}", 1, "jobdw", problem)


# ---------------------------------------------------------------------------- jobdw


@pytest.mark.parametrize("kind", ["xfs", "gfs2", "lustre", "raw"])
def test_jobdw_types(kind):
    (d,) = parse_directives(f"#DW jobdw type={kind} capacity=1TiB name=fs1")
    assert d.args["type"] == kind


def test_jobdw_bad_type():
    assert_error(
        "#DW jobdw type=ext4 capacity=1TiB name=fs1",
        0,
        "jobdw",
        "type='ext4' is not one of xfs, gfs2, lustre, raw",
    )


@pytest.mark.parametrize(
    "missing, example",
    [("type", "type=xfs"), ("capacity", "capacity=10GiB"), ("name", "name=scratch")],
)
def test_jobdw_required_keys(missing, example):
    words = [w for w in XFS.split() if not w.startswith(missing + "=")]
    assert_error(" ".join(words), 0, "jobdw", f"missing required key '{missing}'", example)


@pytest.mark.parametrize("capacity", ["10GiB", "100GB", "1TiB", "512MiB", "1KB", "007TB"])
def test_jobdw_capacity_accepted(capacity):
    parse_directives(f"#DW jobdw type=xfs capacity={capacity} name=fs1")


@pytest.mark.parametrize(
    "capacity, problem",
    [
        ("10XB", "capacity='10XB' is not a size (e.g. 10GiB, 100GB)"),
        ("GiB", "capacity='GiB' is not a size"),
        ("0GiB", "capacity='0GiB' must be more than zero"),
        ("-1GiB", "capacity='-1GiB' must be more than zero"),
        ("10G", "capacity='10G' is not accepted by DWS: use a whole number"),
        ("1.5GiB", "capacity='1.5GiB' is not accepted by DWS"),
        ("1PB", "capacity='1PB' is not accepted by DWS"),
        ("4096", "capacity='4096' is not accepted by DWS"),
    ],
)
def test_jobdw_capacity_rejected(capacity, problem):
    assert_error(f"#DW jobdw type=xfs capacity={capacity} name=fs1", 0, "jobdw", problem)


@pytest.mark.parametrize("name", ["ab", "my-gfs2", "a1", "scratch-", "x-y-z9"])
def test_names_accepted(name):
    assert parse_directives(f"#DW jobdw type=xfs capacity=1GiB name={name}")[0].name == name


@pytest.mark.parametrize("name", ["a", "My-fs", "my_fs", "1fs", "-fs", "fs.1", "fs/1", "Ä-fs"])
def test_names_rejected(name):
    assert_error(
        f"#DW persistentdw name={name}",
        0,
        "persistentdw",
        f"name={name!r} is not a valid name",
        "lower-case letter",
    )


def test_jobdw_profile_and_requires():
    (d,) = parse_directives(f"{XFS} profile=fast-1 requires=copy-offload,user-container-auth")
    assert d.args["profile"] == "fast-1"
    assert d.args["requires"] == "copy-offload,user-container-auth"
    assert_error(f"{XFS} profile=Fast", 0, "jobdw", "profile='Fast' is not a valid name")
    assert_error(f"{XFS} requires=gpu", 0, "jobdw", "requires='gpu' lists 'gpu'", "copy-offload")
    assert_error(f"{XFS} requires=copy-offload,", 0, "jobdw", "lists ''")
    assert_error(f"{XFS} requires=copy-offload,copy-offload", 0, "jobdw", "lists an entry twice")


@pytest.mark.parametrize(
    "word", ["combined_mgtmdt=true", "external_mgs=1.2.3.4@tcp", "capacity_mdt=1GiB"]
)
def test_jobdw_lustre_target_keys_point_to_the_profile(word):
    key = word.split("=")[0]
    assert_error(f"{XFS} {word}", 0, "jobdw", f"key '{key}' is not a #DW key", "profile=")


def test_two_jobdw_with_one_name():
    other = "#DW jobdw type=lustre capacity=1TiB name=scratch"
    assert_error([XFS, GFS2, other], 2, "jobdw", "name='scratch' is already used by directive 0")


# ---------------------------------------------------------------------------- persistent


def test_persistentdw():
    (d,) = parse_directives("#DW persistentdw name=shared requires=copy-offload")
    assert d.name == "shared"
    assert_error("#DW persistentdw requires=copy-offload", 0, "persistentdw", "key 'name'")
    assert_error(
        "#DW persistentdw name=shared type=xfs",
        0,
        "persistentdw",
        "unknown key 'type': persistentdw takes name, requires",
    )


def test_create_persistent_keys():
    (d,) = parse_directives("#DW create_persistent name=shared type=lustre capacity=1TiB")
    assert d.args["capacity"] == "1TiB"
    parse_directives("#DW create_persistent name=shared type=lustre profile=mgt-only")
    assert_error("#DW create_persistent name=shared", 0, "create_persistent", "key 'type'")
    assert_error(
        "#DW create_persistent name=shared type=lustre capacity=2G",
        0,
        "create_persistent",
        "capacity='2G' is not accepted by DWS",
    )
    assert_error(
        "#DW create_persistent name=shared type=xfs requires=copy-offload",
        0,
        "create_persistent",
        "unknown key 'requires'",
    )


def test_destroy_persistent_keys():
    assert parse_directives("#DW destroy_persistent name=shared")[0].name == "shared"
    assert_error("#DW destroy_persistent", 0, "destroy_persistent", "key 'name'")
    assert_error("#DW destroy_persistent name=s1 type=xfs", 0, "destroy_persistent", "'type'")


@pytest.mark.parametrize(
    "solo",
    ["#DW create_persistent name=p1 type=xfs capacity=1GiB", "#DW destroy_persistent name=p1"],
)
def test_create_and_destroy_persistent_must_be_alone(solo):
    command = solo.split()[1]
    assert_error([XFS, solo], 1, command, "must be the job's only #DW directive")
    assert_error([solo, "#DW PreRun action=wait"], 0, command, "only #DW directive")


# ---------------------------------------------------------------------------- copy_in/copy_out


@pytest.mark.parametrize("command", ["copy_in", "copy_out"])
def test_copy_paths(command):
    job = [XFS, "#DW persistentdw name=shared"]
    ok = [
        f"#DW {command} source=/lus/in destination=$DW_JOB_scratch/in profile=dm-1",
        f"#DW {command} source=$DW_PERSISTENT_shared destination=$DW_JOB_scratch",
        f"#DW {command} source=$DW_JOB_scratch/out destination=/lus/out",
    ]
    for line in ok:
        assert parse_directives([*job, line])[2].command == command
    assert_error([*job, f"#DW {command} source=/a"], 2, command, "key 'destination'")
    assert_error([*job, f"#DW {command} destination=/a"], 2, command, "key 'source'")
    assert_error(
        [*job, f"#DW {command} source=lus/in destination=/a"],
        2,
        command,
        "source='lus/in' must be an absolute path or start with $DW_JOB_<name>",
    )
    assert_error(
        [*job, f"#DW {command} source=/a destination=$DW_JOB_/x"],
        2,
        command,
        "destination='$DW_JOB_/x' refers to $DW_JOB_, which is not a valid name",
    )
    assert_error(
        [*job, f"#DW {command} source=/a destination=$DW_JOB_other/x"],
        2,
        command,
        "destination='$DW_JOB_other/x' names no jobdw directive of this job (name=other)",
    )
    assert_error(
        [XFS, f"#DW {command} source=$DW_PERSISTENT_shared/x destination=/a"],
        1,
        command,
        "source='$DW_PERSISTENT_shared/x' needs a '#DW persistentdw name=shared' directive",
    )
    assert_error(
        [*job, f"#DW {command} source=/a destination=/b size=1"], 2, command, "unknown key 'size'"
    )


def test_copy_may_not_use_raw_storage():
    raw = "#DW jobdw type=raw capacity=1GiB name=blocks"
    assert_error(
        [raw, "#DW copy_in source=/lus/a destination=$DW_JOB_blocks/a"],
        1,
        "copy_in",
        "is raw storage (directive 0)",
        "data movement cannot use raw storage",
    )


def test_a_jobdw_reference_may_come_before_its_jobdw():
    parse_directives(["#DW copy_in source=/lus/a destination=$DW_JOB_scratch/a", XFS])


# ---------------------------------------------------------------------------- container

CONTAINER = "#DW container name=my-container profile=red-rock-slushy"


@pytest.mark.parametrize("kind", ["lustre", "gfs2", "raw"])
def test_container_storage_types_accepted(kind):
    storage = f"#DW jobdw type={kind} capacity=1GiB name=store"
    parse_directives([storage, f"{CONTAINER} DW_JOB_local_storage=store"])


def test_container_on_xfs_is_refused():
    assert_error(
        [XFS, f"{CONTAINER} DW_JOB_local_storage=scratch"],
        1,
        "container",
        "DW_JOB_local_storage='scratch' is xfs storage (directive 0)",
        "container storage may be lustre, gfs2 or raw",
    )


def test_container_required_keys_and_patterns():
    parse_directives(CONTAINER)
    assert_error("#DW container name=c1", 0, "container", "missing required key 'profile'")
    assert_error("#DW container profile=p1", 0, "container", "missing required key 'name'")
    assert_error("#DW container name=C1 profile=p1", 0, "container", "name='C1' is not a valid")
    assert_error("#DW container name=c1 profile=p_1", 0, "container", "profile='p_1' is not a")


@pytest.mark.parametrize(
    "word, problem",
    [
        ("DW_JOB_X=my-gfs2", "storage key 'DW_JOB_X' must match"),
        ("DW_JOB_a=my-gfs2", "storage key 'DW_JOB_a' must match"),
        ("DW_SCRATCH_ab=my-gfs2", "unknown key 'DW_SCRATCH_ab': container takes name, profile"),
        ("DW_JOB_ab=other", "DW_JOB_ab='other' names no jobdw directive of this job"),
        ("DW_JOB_ab=Bad", "DW_JOB_ab='Bad' is not a valid name"),
        ("DW_PERSISTENT_ab=shared", "needs a '#DW persistentdw name=shared' directive"),
        ("DW_GLOBAL_ab=lus/global", "DW_GLOBAL_ab='lus/global' must be an absolute path"),
    ],
)
def test_container_storage_keys_rejected(word, problem):
    assert_error([GFS2, f"{CONTAINER} {word}"], 1, "container", problem)


def test_container_storage_keys_accepted():
    (_, _, d) = parse_directives(
        [
            GFS2,
            "#DW persistentdw name=shared",
            f"{CONTAINER} DW_JOB_local=my-gfs2 DW_PERSISTENT_p_1=shared DW_GLOBAL_lus=/lus/g",
        ]
    )
    assert d.args["DW_GLOBAL_lus"] == "/lus/g" and d.name == "my-container"


def test_at_most_one_container():
    assert_error(
        [CONTAINER, XFS, "#DW container name=second profile=p1"],
        2,
        "container",
        "only one container directive is allowed (directive 0)",
    )


# ---------------------------------------------------------------------------- test directives


@pytest.mark.parametrize("state", list(State))
def test_test_directive_for_every_state(state):
    (d,) = parse_directives(f"#DW {state.value} action=wait")
    assert d.command == state.value and d.is_test and d.args["action"] == "wait"


def test_test_directive_actions():
    (d,) = parse_directives("#DW PostRun action=error message=disk_on_fire severity=Major")
    assert d.args["message"] == "disk_on_fire" and d.args["severity"] == "Major"
    parse_directives("#DW Setup action=error")
    parse_directives("#DW Setup action=complete")
    # the driver ignores message/severity unless action=error; DWS admits them anyway
    parse_directives("#DW Setup action=wait message=x severity=fatal")
    # the driver lower-cases the severity; an empty one means Minor, an empty message is ""
    (d,) = parse_directives("#DW Setup action=error message= severity=")
    assert d.args["message"] == "" and d.args["severity"] == ""
    assert d.text == "#DW Setup action=error message= severity="
    assert parse_directives(d.text) == (d,)
    assert_error("#DW Setup", 0, "Setup", "missing required key 'action'")
    assert_error("#DW Setup action=explode", 0, "Setup", "action='explode' is not one of wait")
    assert_error("#DW Setup action=Wait", 0, "Setup", "action='Wait' is not one of wait")
    assert_error("#DW Setup action=", 0, "Setup", "key 'action' has an empty value")
    assert_error("#DW Setup action=wait message", 0, "Setup", "word 'message' is not key=value")
    assert_error(
        "#DW Setup action=error severity=fatally",
        0,
        "Setup",
        "severity='fatally' is not one of Minor, Major, Fatal (in any letter case)",
    )
    # message is one word: the rest of the line is not part of it
    assert_error("#DW Setup action=error message=disk on fire", 0, "Setup", "word 'on'")


# ---------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, size",
    [
        ("10GiB", 10 * 2**30),
        ("100GB", 100 * 10**9),
        ("1TiB", 2**40),
        ("512MiB", 512 * 2**20),
        ("10G", 10 * 10**9),
        ("2P", 2 * 10**15),
        ("1PiB", 2**50),
        ("3KB", 3000),
        ("3K", 3000),
        ("4096", 4096),
        ("7B", 7),
        ("1.5KiB", 1536),
        (".5KB", 500),
        ("1.0001KB", 1001),  # a capacity is a minimum: part of a byte rounds up
        (" 1GiB\n", 2**30),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10XB", "is not a size"),
        ("10 GiB", "is not a size"),
        ("10gib", "is not a size"),
        ("", "is not a size"),
        ("1e3GB", "is not a size"),
        ("0", "must be more than zero"),
        ("0.0GiB", "must be more than zero"),
        ("-5GiB", "must be more than zero"),
        ("9000PiB", "is too large"),
        ("9" * 100, "is not a size"),
    ],
)
def test_parse_size_errors_name_the_text(text, problem):
    with pytest.raises(DirectiveError) as info:
        parse_size(text)
    message = str(info.value)
    assert problem in message and repr(text.strip())[:20] in message


def test_parse_size_rejects_non_text():
    with pytest.raises(DirectiveError, match="not a string"):
        parse_size(10)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- properties

names = st.from_regex(r"[a-z][a-z0-9-]{1,10}", fullmatch=True)
path_words = st.text(
    st.characters(min_codepoint=33, max_codepoint=0x2FF, blacklist_characters="\x85\xa0"),
    max_size=12,
)
capacities = st.builds(
    "{}{}".format,
    st.integers(1, 10**6),
    st.sampled_from(["KiB", "KB", "MiB", "MB", "GiB", "GB", "TiB", "TB"]),
)


@st.composite
def directive_sets(draw):
    """(words of each directive) for a valid job; keys in any order, any directive order."""
    storage = st.tuples(names, st.sampled_from(["xfs", "gfs2", "lustre", "raw"]))
    jobdw = draw(st.lists(storage, max_size=4, unique_by=lambda t: t[0]))
    persistent = draw(st.lists(names, max_size=2))
    lines = []
    for name, kind in jobdw:
        pairs = [("type", kind), ("capacity", draw(capacities)), ("name", name)]
        if draw(st.booleans()):
            pairs.append(("profile", draw(names)))
        if draw(st.booleans()):
            pairs.append(("requires", "copy-offload"))
        lines.append(("jobdw", draw(st.permutations(pairs))))
    lines += [("persistentdw", [("name", name)]) for name in persistent]
    movable = [f"$DW_JOB_{n}" for n, kind in jobdw if kind != "raw"]
    movable += [f"$DW_PERSISTENT_{n}" for n in persistent]
    movable += [ref.replace("-", "_") for ref in movable]  # as nnf-sos reads them
    paths = st.one_of(
        st.builds("/{}".format, path_words),
        *([st.builds("{}/{}".format, st.sampled_from(movable), path_words)] if movable else []),
    )
    for _ in range(draw(st.integers(0, 2))):
        command = draw(st.sampled_from(["copy_in", "copy_out"]))
        lines.append((command, [("source", draw(paths)), ("destination", draw(paths))]))
    if draw(st.booleans()):
        pairs = [("name", draw(names)), ("profile", draw(names))]
        usable = [n for n, kind in jobdw if kind != "xfs"]
        targets = draw(st.lists(st.sampled_from(usable), max_size=2)) if usable else []
        for i, target in enumerate(targets):
            pairs.append((f"DW_JOB_s{i}", target))
        if persistent:
            pairs.append(("DW_PERSISTENT_p0", persistent[0]))
        if draw(st.booleans()):
            pairs.append(("DW_GLOBAL_g0", draw(st.builds("/{}".format, path_words))))
        lines.append(("container", draw(st.permutations(pairs))))
    for state in draw(st.lists(st.sampled_from(TEST_COMMANDS), max_size=2)):
        pairs = [("action", draw(st.sampled_from(["wait", "complete", "error"])))]
        if draw(st.booleans()):  # any action: the test driver reads them only for error
            pairs += [("message", draw(st.from_regex(r"[A-Za-z_]{0,10}", fullmatch=True)))]
        if draw(st.booleans()):
            severity = draw(st.sampled_from(["", "Minor", "Major", "Fatal"]))
            pairs += [("severity", draw(st.sampled_from([severity, severity.upper()])))]
        lines.append((state, draw(st.permutations(pairs))))
    lines = draw(st.permutations(lines))
    if not lines or draw(st.integers(0, 9)) == 0:  # sometimes a solo persistent command
        kind = draw(st.sampled_from(["create_persistent", "destroy_persistent"]))
        pairs = [("name", draw(names))] + ([("type", "lustre")] if kind[0] == "c" else [])
        lines = [(kind, pairs)]
    return [(command, list(pairs)) for command, pairs in lines]


spaces = st.sampled_from([" ", "  ", "\t", " \n "])


@settings(max_examples=150, deadline=None)
@given(directive_sets(), st.data())
def test_valid_sets_parse_and_round_trip(job, data):
    def spaced(words):
        return "".join(data.draw(spaces) + word for word in words).lstrip(" ")

    texts = [spaced(["#DW", command, *(f"{k}={v}" for k, v in pairs)]) for command, pairs in job]
    parsed = parse_directives(texts)
    assert [(d.index, d.command, list(d.args.items())) for d in parsed] == [
        (i, command, pairs) for i, (command, pairs) in enumerate(job)
    ]
    for d in parsed:
        assert d.text == " ".join(d.text.split()) and d.text.startswith("#DW ")
    assert parse_directives([d.text for d in parsed]) == parsed
    assert parse_directives("\n".join(d.text for d in parsed)) == parsed
    assert parse_directives(" ".join(d.text for d in parsed)) == parsed


BAD_DIRECTIVES = [
    "#DW jobdw type=xfs capacity=10XB name=zz-new",
    "#DW jobdw type=xfs name=zz-new",
    "#DW jobdw type=xfs capacity=1GiB name=zz-new colour=red",
    "#DW jobdw type=zfs capacity=1GiB name=zz-new",
    "#DW persistentdw name=Z",
    "#DW copy_in source=relative destination=/x",
    "#DW container name=c1",
    "#DW Setup action=wait severity=Fatally",
    "#DW nonsense",
    "#DW",
    "#DW persistentdw name=a1 name=a2",
    "#DW persistentdw name",
]


@settings(max_examples=100, deadline=None)
@given(directive_sets(), st.data())
def test_a_bad_directive_is_named_by_its_index(job, data):
    texts = [" ".join(["#DW", command, *(f"{k}={v}" for k, v in pairs)]) for command, pairs in job]
    position = data.draw(st.integers(0, len(texts)))
    texts.insert(position, data.draw(st.sampled_from(BAD_DIRECTIVES)))
    message = error_of(texts)
    assert re.match(rf"#DW directive {position}[ :]", message), message


def _check_error_message(message: str, directive_words: int) -> None:
    assert "\n" not in message and message == " ".join(message.split())
    if message.startswith("no #DW directives given"):
        return
    match = re.match(r"#DW directives must be|#DW directive (\d+)[ :]", message)
    assert match, message
    if match.group(1) is not None:
        assert int(match.group(1)) <= directive_words


VOCABULARY = [
    "#DW", "#dw", "jobdw", "persistentdw", "container", "copy_in", "copy_out", "PreRun",
    "create_persistent", "destroy_persistent", "type=xfs", "type=gfs2", "type=raw", "type=",
    "capacity=1GiB", "capacity=0GB", "capacity=1.5TB", "name=ab", "name=cd", "name=A", "=",
    "profile=p1", "requires=copy-offload", "source=/a", "destination=$DW_JOB_ab/x",
    "source=$DW_PERSISTENT_cd", "DW_JOB_ab=ab", "DW_JOB_cd=cd", "DW_GLOBAL_gl=/g",
    "action=wait", "action=error", "message=m", "severity=Fatal", "\n", "\u2028", "é",
]  # fmt: skip
texts = st.one_of(
    st.text(max_size=80),
    st.lists(st.sampled_from(VOCABULARY), max_size=14).map(" ".join),
    st.lists(  # directive-shaped: "#DW <command> <words>", to reach the per-key rules
        st.tuples(
            st.sampled_from([*COMMANDS, *TEST_COMMANDS]),
            st.lists(st.sampled_from(VOCABULARY), max_size=5),
        ),
        min_size=1,
        max_size=3,
    ).map(lambda ds: " ".join(f"#DW {c} {' '.join(ws)}" for c, ws in ds)),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(texts, st.lists(texts, max_size=4)))
def test_any_text_gives_directives_or_a_one_line_directive_error(value):
    chunks = [value] if isinstance(value, str) else value
    count = sum(words(chunk).count("#DW") for chunk in chunks)
    try:
        parsed = parse_directives(value)
    except DirectiveError as exc:
        _check_error_message(str(exc), count)
    else:
        assert len(parsed) == count and parse_directives([d.text for d in parsed]) == parsed


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_parse_size_gives_bytes_or_a_directive_error(text):
    try:
        size = parse_size(text)
    except DirectiveError as exc:
        assert "\n" not in str(exc) and "size" in str(exc)
    else:
        assert size >= 1
