# SPDX-License-Identifier: LGPL-3.0-only
"""Directive lists taken from the real systems, with the verdict DWS and nnf-sos give them.

Each group cites the public source its cases come from (mirrored under /work/.mirror).  A
case is accepted when DWS admits the Workflow (utils/dwdparse against the nnf and
dws-test-driver DWDirectiveRules) and nnf-sos passes it in Proposal; flux-dws must accept
exactly those, and refuse the others at submit with a one-line error naming the directive.
Checks that need the cluster (does a profile, a persistent instance or a global Lustre file
system exist) cannot be made at submit; such cases are accepted here and noted.

Directives are quoted as their sources write them, hence long lines.
"""
# ruff: noqa: E501

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flux_dws.base.errors import DirectiveError
from flux_dws.core.directives import parse_directives, split_directives
from flux_dws.testing.ruleset import admission_error


class Case(NamedTuple):
    directives: str | tuple[str, ...]
    # None: accepted.  Otherwise (index of the directive named, text the error contains).
    error: tuple[int, str] | None = None


def ok(*directives: str) -> Case:
    return Case(directives if len(directives) > 1 else directives[0])


def bad(index: int, part: str, *directives: str) -> Case:
    return Case(directives if len(directives) > 1 else directives[0], (index, part))


# ---------------------------------------------------------------------------------------
# DataWorkflowServices/dws utils/dwdparse/dwdparse_test.go (TestDWParse and friends).  Its
# own test rules allow upper case and '_' in names; the nnf ruleset does not, so those
# names are lower-cased here, and the originals are refused below under the nnf pattern.
DWDPARSE = [
    ok("#DW jobdw type=raw    capacity=100GB name=prettygoodname  "),
    ok("#DW jobdw type=xfs    capacity=100GB name=pretty-goodname "),
    ok("#DW jobdw type=gfs2   capacity=100GB name=pretty-goodname "),
    ok("#DW jobdw type=lustre capacity=100GB name=prettygood-name "),
    ok("#DW jobdw type=raw    capacity=100TB name=prettygoodname"),
    ok("#DW jobdw type=lustre capacity=100TB name=p0rettygoodname1"),
    ok("#DW jobdw type=lustre capacity=100GB name=coolprofile1 profile=this-type-profile08"),
    ok("#DW create_persistent type=raw    capacity=100GB name=prettygoodname  "),
    ok("#DW create_persistent type=xfs    capacity=100GB name=prettygoodname  "),
    ok("#DW create_persistent type=gfs2   capacity=100GB name=prettygoodname  "),
    ok("#DW create_persistent type=lustre capacity=100TB name=prettygoodname  "),
    ok("#DW create_persistent type=lustre capacity=100GB name=cool1 profile=this-type-profile08"),
    ok("#DW persistentdw name=evenbettername"),
    ok("#DW destroy_persistent name=evenbettername"),
    bad(0, "profile='0this'", "#DW jobdw type=lustre capacity=100GB name=u1 profile=0this"),
    bad(0, "profile='this!'", "#DW jobdw type=lustre capacity=100GB name=u2 profile=this!"),
    bad(0, "profile='_this'", "#DW jobdw type=lustre capacity=100GB name=u3 profile=_this"),
    bad(0, "profile='-this'", "#DW jobdw type=lustre capacity=100GB name=u4 profile=-this"),
    bad(0, "'profile' is not key=value", "#DW jobdw type=lustre capacity=100GB name=u5 profile"),
    bad(
        0, "profile='0this'", "#DW create_persistent type=lustre capacity=1GB name=u1 profile=0this"
    ),
    bad(
        0, "profile='-this'", "#DW create_persistent type=lustre capacity=1GB name=u4 profile=-this"
    ),
    bad(
        0,
        "'boolcheck1' is not key=value",
        "#DW jobdw type=lustre capacity=100GB name=b1 boolcheck1",
    ),
    bad(
        0, "only #DW directive", "#DW destroy_persistent name=u1", "#DW destroy_persistent name=u2"
    ),
    bad(
        0, "only #DW directive", "#DW destroy_persistent name=c1", "#DW destroy_persistent name=c1"
    ),
    bad(0, "no #DW directives given", "                                                   "),
    bad(0, "does not start with #DW", "    jobdw type=raw     capacity=100GB name=prettygoodname"),
    bad(0, "unknown command 'type=xfs'", "#DW       type=xfs     capacity=100TB name=nocommand"),
    bad(0, "unknown command 'bogus'", "#DW bogus the_rest_does_not_matter"),
    bad(0, "unknown command 'jobd'", "#DW jobd  type=lustre  capacity=100TB name=badcommand"),
    bad(0, "unknown key 'tye'", "#DW jobdw tye=badtype  capacity=100TB name=badtype"),
    bad(0, "type='badtype'", "#DW jobdw type=badtype capacity=100TB name=badtype"),
    bad(0, "missing required key 'type'", "#DW jobdw              capacity=100TB name=missingtype"),
    bad(0, "type='file'", "#DW jobdw type=file    capacity=100TB name=badtype"),
    bad(0, "unknown key 'caacity'", "#DW jobdw type=raw     caacity=100TB  name=badcapacity"),
    bad(0, "capacity='bad'", "#DW jobdw type=raw     capacity=bad   name=badcapacity"),
    bad(0, "unknown key 'ame'", "#DW jobdw type=xfs     capacity=100TB ame=badname"),
    bad(0, "is not a valid name", "#DW jobdw type=xfs     capacity=100TB name=!!21//\\"),
    bad(0, "missing required key", "#DW jobdw"),
    bad(0, "'type' is given twice", "#DW jobdw type=raw type=raw capacity=100TB name=dup"),
    bad(0, "'type' is given twice", "#DW jobdw type=raw capacity=100TB name=conflict type=xfs"),
    bad(0, "type='badtype'", "#DW jobdw type=badtype destination=/a source=/b"),
    bad(0, "unknown command 'stage_in'", "#DW stage_in type=file destination=$DW_JOB_S source=/p"),
    bad(0, "unknown command 'stage_out'", "#DW stage_out type=file destination=/p source=/q"),
    # TestRequiresKeyword: a list of known words, none twice
    ok("#DW jobdw type=xfs capacity=1GB name=r1 requires=copy-offload,user-container-auth"),
    ok("#DW jobdw type=xfs capacity=1GB name=r1 requires=user-container-auth,copy-offload"),
    bad(0, "lists 'none-such'", "#DW jobdw type=xfs capacity=1GB name=r1 requires=none-such"),
    bad(0, "lists 'none-such'", "#DW persistentdw name=r1 requires=none-such,copy-offload"),
    bad(0, "lists an entry twice", "#DW persistentdw name=r1 requires=copy-offload,copy-offload"),
    # TestUniqueWithin: jobdw names are unique within a workflow (uniqueWithin: jobdw_name)
    ok(
        "#DW jobdw type=xfs capacity=1GB name=unique1",
        "#DW jobdw type=xfs capacity=1GB name=unique2",
    ),
    bad(
        1,
        "name='same' is already used by directive 0",
        "#DW jobdw type=xfs capacity=1GB name=same",
        "#DW jobdw type=gfs2 capacity=1GB name=same",
    ),
]

# ---------------------------------------------------------------------------------------
# DataWorkflowServices/dws utils/dwdparse/dwdparse.go (BuildArgsMap, ValidateArgs): words
# split at white space as Go's strings.Fields, the value after the first '=', "key" without
# '=' has no value (refused: every nnf key requires one), "key=" has the empty value, which
# only a key without a pattern takes.
DWDPARSE_WORDS = [
    ok("#DW\tjobdw\ntype=xfs\u3000capacity=1GB\u00a0name=ws"),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=ws",
        "#DW copy_in source=/lus/a=b destination=$DW_JOB_ws/c=d",
    ),
    bad(0, "'name' is not key=value", "#DW persistentdw name"),
    bad(0, "key 'name' has an empty value", "#DW persistentdw name="),
    bad(0, "key 'capacity' has an empty value", "#DW jobdw type=xfs capacity= name=ws"),
    bad(0, "key 'requires' has an empty value", "#DW persistentdw name=ws requires="),
    bad(
        1,
        "key 'source' has an empty value",
        "#DW jobdw type=xfs capacity=1GB name=ws",
        "#DW copy_in source= destination=$DW_JOB_ws",
    ),
    bad(0, "empty key", "#DW persistentdw name=ws =x"),
    bad(0, "name='=ws'", "#DW persistentdw name==ws"),
    bad(0, "unknown key 'command'", "#DW persistentdw name=ws command=jobdw"),
    bad(0, "missing command after #DW", "#DW"),
    # \x1c-\x1f are white space to Python's str.split(), not to Go: they stay in the word
    bad(0, "name='ab\\x1ccd' is not a valid name", "#DW persistentdw name=ab\x1ccd"),
    bad(0, "unknown command 'jobdw\\x1f'", "#DW jobdw\x1f type=xfs capacity=1GB name=ws"),
    # a capacity is ASCII digits (Go's \d)
    bad(0, "capacity='١GB'", "#DW jobdw type=xfs capacity=١GB name=ws"),
]

# ---------------------------------------------------------------------------------------
# NearNodeFlash/nnf-sos config/dws/nnf-ruleset.yaml: the keys each command takes, required
# or not, and their value patterns.
NNF_RULESET = [
    # jobdw: type, capacity, name required; profile, requires optional
    ok("#DW jobdw type=raw capacity=1KB name=ab"),
    ok("#DW jobdw capacity=1KiB name=ab type=xfs"),
    ok("#DW jobdw name=ab type=gfs2 capacity=7MB"),
    ok("#DW jobdw name=ab type=lustre capacity=7MiB profile=p-1"),
    ok("#DW jobdw type=xfs capacity=10GiB name=a-b-c requires=copy-offload"),
    ok("#DW jobdw type=xfs capacity=0010TiB name=a0"),
    ok("#DW jobdw type=xfs capacity=9000000TB name=big"),
    # more bytes than nnf-sos's int64 holds: its breakdown gets a negative minimumCapacity
    bad(
        0, "capacity='123456789TB' is too large", "#DW jobdw type=xfs capacity=123456789TB name=big"
    ),
    bad(0, "missing required key 'capacity'", "#DW jobdw type=xfs name=ab"),
    bad(0, "missing required key 'name'", "#DW jobdw type=xfs capacity=1GB"),
    bad(0, "type='XFS'", "#DW jobdw type=XFS capacity=1GB name=ab"),
    bad(0, "type='ext4'", "#DW jobdw type=ext4 capacity=1GB name=ab"),
    bad(0, "capacity='1G'", "#DW jobdw type=xfs capacity=1G name=ab"),
    bad(0, "capacity='1gb'", "#DW jobdw type=xfs capacity=1gb name=ab"),
    bad(0, "capacity='1.5TB'", "#DW jobdw type=xfs capacity=1.5TB name=ab"),
    bad(0, "capacity='1PiB'", "#DW jobdw type=xfs capacity=1PiB name=ab"),
    bad(0, "capacity='1024'", "#DW jobdw type=xfs capacity=1024 name=ab"),
    bad(0, "capacity='+1GB'", "#DW jobdw type=xfs capacity=+1GB name=ab"),
    bad(0, "name='a'", "#DW jobdw type=xfs capacity=1GB name=a"),
    bad(0, "name='Ab'", "#DW jobdw type=xfs capacity=1GB name=Ab"),
    bad(0, "name='a_b'", "#DW jobdw type=xfs capacity=1GB name=a_b"),
    bad(0, "name='1ab'", "#DW jobdw type=xfs capacity=1GB name=1ab"),
    bad(0, "name='ab.c'", "#DW jobdw type=xfs capacity=1GB name=ab.c"),
    bad(0, "profile='P1'", "#DW jobdw type=xfs capacity=1GB name=ab profile=P1"),
    bad(0, "requires='gpu'", "#DW jobdw type=xfs capacity=1GB name=ab requires=gpu"),
    bad(
        0,
        "requires='Copy-Offload'",
        "#DW jobdw type=xfs capacity=1GB name=ab requires=Copy-Offload",
    ),
    bad(0, "lists ''", "#DW jobdw type=xfs capacity=1GB name=ab requires=copy-offload,"),
    bad(
        0,
        "unknown key 'access_mode'",
        "#DW jobdw type=xfs capacity=1GB name=ab access_mode=striped",
    ),
    bad(0, "unknown key 'Type'", "#DW jobdw Type=xfs capacity=1GB name=ab"),
    # Lustre target keys live in the NnfStorageProfile, not the directive
    bad(
        0,
        "key 'combined_mgtmdt' is not a #DW key",
        "#DW jobdw type=lustre capacity=1GB name=ab combined_mgtmdt",
    ),
    bad(
        0,
        "key 'external_mgs' is not a #DW key",
        "#DW jobdw type=lustre capacity=1GB name=ab external_mgs=1.2.3.4@tcp",
    ),
    bad(
        0,
        "key 'capacity_mdt' is not a #DW key",
        "#DW jobdw type=lustre capacity=1GB name=ab capacity_mdt=1GB",
    ),
    bad(
        0,
        "key 'capacity_mgt' is not a #DW key",
        "#DW create_persistent type=lustre capacity=1GB name=ab capacity_mgt=1GB",
    ),
    # create_persistent: name, type required; capacity, profile optional
    ok("#DW create_persistent name=ab type=lustre"),
    ok("#DW create_persistent name=ab type=lustre profile=mgt-pool"),
    ok("#DW create_persistent type=raw name=ab capacity=5GiB profile=pp"),
    bad(0, "missing required key 'type'", "#DW create_persistent name=ab capacity=1GB"),
    bad(0, "missing required key 'name'", "#DW create_persistent type=xfs capacity=1GB"),
    bad(
        0, "unknown key 'requires'", "#DW create_persistent name=ab type=xfs requires=copy-offload"
    ),
    bad(0, "name='Ab'", "#DW create_persistent name=Ab type=xfs"),
    # destroy_persistent: name only
    ok("#DW destroy_persistent name=ab"),
    bad(0, "unknown key 'type'", "#DW destroy_persistent name=ab type=xfs"),
    bad(0, "missing required key 'name'", "#DW destroy_persistent"),
    bad(0, "name='a_b'", "#DW destroy_persistent name=a_b"),
    # persistentdw: name required, requires optional
    ok("#DW persistentdw name=ab requires=user-container-auth"),
    ok("#DW persistentdw name=ab", "#DW persistentdw name=ab"),  # no uniqueWithin rule
    bad(0, "unknown key 'capacity'", "#DW persistentdw name=ab capacity=1GB"),
    bad(0, "unknown key 'profile'", "#DW persistentdw name=ab profile=pp"),
    # copy_in / copy_out: source, destination required; profile optional
    ok(
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in source=/g/in destination=$DW_JOB_ab profile=dm-x",
    ),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_out destination=/g/out source=$DW_JOB_ab/",
    ),
    bad(
        1,
        "missing required key 'destination'",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in source=/g/in",
    ),
    bad(0, "missing required key 'source'", "#DW copy_out destination=/g/out"),
    bad(
        1,
        "profile='Dm'",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in source=/a destination=$DW_JOB_ab profile=Dm",
    ),
    bad(
        1,
        "unknown key 'type'",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in type=file source=/a destination=$DW_JOB_ab",
    ),
    # container: name, profile required; DW_JOB_/DW_PERSISTENT_/DW_GLOBAL_ storage keys
    ok("#DW container name=ab profile=pp"),
    ok("#DW container profile=pp name=ab DW_GLOBAL_lus_1=/lus/global"),
    bad(0, "missing required key 'profile'", "#DW container name=ab"),
    bad(0, "missing required key 'name'", "#DW container profile=pp"),
    bad(0, "storage key 'DW_JOB_Ab' must match", "#DW container name=ab profile=pp DW_JOB_Ab=xy"),
    bad(0, "storage key 'DW_JOB_a' must match", "#DW container name=ab profile=pp DW_JOB_a=xy"),
    bad(0, "storage key 'DW_JOB_a-b' must match", "#DW container name=ab profile=pp DW_JOB_a-b=xy"),
    bad(
        0,
        "storage key 'DW_GLOBAL_1a' must match",
        "#DW container name=ab profile=pp DW_GLOBAL_1a=/x",
    ),
    bad(0, "unknown key 'DW_SCRATCH_ab'", "#DW container name=ab profile=pp DW_SCRATCH_ab=/x"),
    bad(0, "unknown key 'dw_job_ab'", "#DW container name=ab profile=pp dw_job_ab=xy"),
    bad(0, "unknown key 'image'", "#DW container name=ab profile=pp image=busybox"),
]

# ---------------------------------------------------------------------------------------
# NearNodeFlash/nnf-sos internal/controller/nnf_workflow_controller_helpers.go
# (validateWorkflow, validateStagingDirective, splitStagingArgumentIntoNameAndPath,
# validateContainerDirective): the job-wide rules nnf-sos applies in Proposal.
NNF_PROPOSAL = [
    # create_persistent / destroy_persistent are alone in their workflow
    bad(
        1,
        "only #DW directive",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW create_persistent name=p2 type=xfs",
    ),
    bad(
        0, "only #DW directive", "#DW create_persistent name=p2 type=xfs", "#DW PreRun action=wait"
    ),
    bad(1, "only #DW directive", "#DW persistentdw name=ab", "#DW destroy_persistent name=ab"),
    # one container directive
    bad(
        1,
        "only one container directive",
        "#DW container name=c1 profile=pp",
        "#DW container name=c2 profile=pp",
    ),
    # copy references: '_' stands for '-' in the storage name
    ok(
        "#DW jobdw type=xfs capacity=1GB name=a-b-c",
        "#DW copy_in source=/l/x destination=$DW_JOB_a_b_c/x",
    ),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=a-b-c",
        "#DW copy_in source=/l/x destination=$DW_JOB_a-b_c/x",
    ),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=a-b",
        "#DW copy_out source=$DW_JOB_a_b destination=/l/x",
    ),
    ok("#DW persistentdw name=p-q", "#DW copy_out source=$DW_PERSISTENT_p_q/o destination=/l/x"),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in source=/l/x destination=$DW_JOB_ab/y_z/w",
    ),
    bad(
        1,
        "destination='$DW_JOB_a_b_x/x' names no jobdw directive of this job (name=a_b_x",
        "#DW jobdw type=xfs capacity=1GB name=a-b-c",
        "#DW copy_in source=/l/x destination=$DW_JOB_a_b_x/x",
    ),
    bad(
        1,
        "$DW_JOB_A_b",
        "#DW jobdw type=xfs capacity=1GB name=a-b",
        "#DW copy_in source=/l/x destination=$DW_JOB_A_b",
    ),
    bad(
        1,
        "names no jobdw directive",
        "#DW persistentdw name=ab",
        "#DW copy_in source=/l destination=$DW_JOB_ab",
    ),
    bad(
        1,
        "needs a '#DW persistentdw name=ab'",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW copy_in source=/l destination=$DW_PERSISTENT_ab",
    ),
    bad(0, "$DW_PERSISTENT_p_q", "#DW copy_out source=$DW_PERSISTENT_p_q/o destination=/l/x"),
    bad(
        1,
        "data movement cannot use raw storage",
        "#DW jobdw type=raw capacity=1GB name=ab",
        "#DW copy_in source=/l destination=$DW_JOB_ab/",
    ),
    bad(0, "must be an absolute path", "#DW copy_in source=lus/x destination=/l/y"),
    bad(0, "must be an absolute path", "#DW copy_in source=$DW_JOBab destination=/l/y"),
    bad(0, "must be an absolute path", "#DW copy_in source=$DW_GLOBAL_ab destination=/l/y"),
    bad(0, "must be an absolute path", "#DW copy_in source=~/x destination=/l/y"),
    bad(0, "which is not a valid name", "#DW copy_in source=/l/x destination=$DW_JOB_/x"),
    # a container's storage value is the storage name itself: no '_' -> '-' here
    ok(
        "#DW jobdw type=gfs2 capacity=1GB name=a-b",
        "#DW container name=cc profile=pp DW_JOB_x_y=a-b",
    ),
    bad(
        1,
        "DW_JOB_xy='a_b' is not a valid name",
        "#DW jobdw type=gfs2 capacity=1GB name=a-b",
        "#DW container name=cc profile=pp DW_JOB_xy=a_b",
    ),
    bad(
        1,
        "DW_JOB_xy='zz' names no jobdw directive",
        "#DW jobdw type=gfs2 capacity=1GB name=ab",
        "#DW container name=cc profile=pp DW_JOB_xy=zz",
    ),
    bad(
        1,
        "needs a '#DW persistentdw name=ab'",
        "#DW jobdw type=gfs2 capacity=1GB name=ab",
        "#DW container name=cc profile=pp DW_PERSISTENT_xy=ab",
    ),
    bad(0, "key 'DW_JOB_xy' has an empty value", "#DW container name=cc profile=pp DW_JOB_xy="),
    bad(
        0,
        "DW_GLOBAL_xy='lus' must be an absolute path",
        "#DW container name=cc profile=pp DW_GLOBAL_xy=lus",
    ),
    bad(
        1,
        "is xfs storage",
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW container name=cc profile=pp DW_JOB_xy=ab",
    ),
]

# ---------------------------------------------------------------------------------------
# NearNodeFlash/nnf-sos internal/controller/integration_test.go
INTEGRATION = [
    ok("#DW jobdw name=jobdw-raw    type=raw    capacity=1GiB"),
    ok("#DW jobdw name=jobdw-xfs    type=xfs    capacity=1GiB"),
    ok("#DW jobdw name=jobdw-xfs2   type=xfs    capacity=1GiB requires=copy-offload"),
    ok("#DW jobdw name=jobdw-gfs2   type=gfs2   capacity=1GiB"),
    ok("#DW jobdw name=jobdw-lustre type=lustre capacity=1GiB"),
    ok("#DW create_persistent name=createpersistent-xfs    type=xfs    capacity=1GiB"),
    ok("#DW create_persistent name=createpersistent-gfs2   type=gfs2   capacity=1GiB"),
    ok("#DW create_persistent name=createpersistent-lustre type=lustre capacity=1GiB"),
    ok("#DW persistentdw name=createpersistent-xfs"),
    ok("#DW persistentdw name=createpersistent-xfs2 requires=copy-offload"),
    ok("#DW destroy_persistent name=doesnotexist"),
    ok("#DW destroy_persistent name=createpersistent-xfs   "),
    ok(
        "#DW jobdw name=test-dm-0 type=gfs2 capacity=1GiB",
        "#DW copy_in source=/lus/maui/file destination=$DW_JOB_test_dm_0/file",
    ),
    ok(
        "#DW jobdw name=test-dm-0 type=gfs2 capacity=1GiB",
        "#DW copy_out source=$DW_JOB_test_dm_0/file destination=/lus/maui/file",
    ),
    ok(
        "#DW jobdw name=test-dm-0 type=gfs2 capacity=1GiB",
        "#DW copy_in source=/lus/maui/file destination=$DW_JOB_test_dm_0/file",
        "#DW copy_out source=$DW_JOB_test_dm_0/file destination=/lus/maui/file",
    ),
    ok("#DW container name=wf-name profile=container-profile"),
    ok("#DW jobdw type=lustre profile=external-mgs capacity=5GB name=profile-mgs"),
    bad(
        1,
        "only #DW directive",
        "#DW jobdw name=jobdw type=xfs capacity=1GiB",
        "#DW create_persistent name=p2 type=xfs capacity=1GiB",
    ),
    bad(
        1,
        "only #DW directive",
        "#DW persistentdw name=jobdw",
        "#DW create_persistent name=p2 type=xfs capacity=1GiB",
    ),
    bad(
        0,
        "only #DW directive",
        "#DW create_persistent name=p1 type=xfs capacity=1GiB",
        "#DW create_persistent name=p2 type=xfs capacity=1GiB",
    ),
    bad(
        0, "only #DW directive", "#DW destroy_persistent name=p1", "#DW destroy_persistent name=p2"
    ),
    bad(
        0,
        "only #DW directive",
        "#DW create_persistent name=p1 type=xfs capacity=1GiB",
        "#DW destroy_persistent name=p1",
    ),
    bad(
        0,
        "names no jobdw directive of this job (name=not_there); '_' in a reference stands for '-'",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_JOB_not_there/my-file.out",
    ),
    bad(
        0,
        "needs a '#DW persistentdw name=mpi'",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_PERSISTENT_mpi/my-persistent-file.out",
    ),
]

# ---------------------------------------------------------------------------------------
# NearNodeFlash/nnf-sos internal/controller/nnf_workflow_controller_test.go and
# directivebreakdown_controller_test.go.  A profile that does not exist, a persistent
# instance that does not exist and a path outside every global Lustre file system fail in
# Proposal, but only the cluster knows them: accepted at submit.
NNF_WORKFLOW = [
    ok("#DW jobdw name=test profile=none-such type=lustre capacity=1GiB"),  # runtime check
    ok(
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_in profile=none-such source=/lus/maui/my-file.in destination=$DW_JOB_test",
    ),
    ok(
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_JOB_test",
    ),
    ok(
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_in source=/lus/INCORRECT/my-file.in destination=$DW_JOB_test/my-file.out",
    ),
    ok(
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_out source=$DW_JOB_test/my-file.int destination=/lus/INCORRECT/my-file.out",
    ),
    bad(
        1,
        "$DW_JOB_INCORRECT",
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_JOB_INCORRECT/my-file.out",
    ),
    bad(
        1,
        "$DW_JOB_INCORRECT",
        "#DW jobdw name=test type=lustre capacity=1GiB",
        "#DW copy_out source=$DW_JOB_INCORRECT/my-file.in destination=/lus/maui/my-file.out",
    ),
    bad(
        1,
        "$DW_PERSISTENT_INCORRECT, which is not a valid name",
        "#DW create_persistent name=test type=lustre capacity=1GiB",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_PERSISTENT_INCORRECT/my-file.out",
    ),
    bad(
        0,
        "only #DW directive",
        "#DW create_persistent name=test type=lustre capacity=1GiB",
        "#DW copy_in source=/lus/maui/my-file.in destination=$DW_PERSISTENT_test/my-file.out",
    ),
    bad(
        1,
        "$DW_PERSISTENT_INCORRECT, which is not a valid name",
        "#DW create_persistent name=test type=lustre capacity=1GiB",
        "#DW copy_out source=$DW_PERSISTENT_INCORRECT/my-file.int destination=/lus/maui/my-file.out",
    ),
    # persistent storage named "persistent-<uuid>", referenced with '-' written as '_'
    ok(
        "#DW persistentdw name=persistent-1a2b3c4d",
        "#DW copy_in source=/lus/maui/my-file.in profile=dm-profile destination=$DW_PERSISTENT_persistent_1a2b3c4d/my-persistent-file.out",
    ),
    ok(
        "#DW jobdw name=container-storage type=gfs2 capacity=1GB requires=copy-offload,user-container-auth",
        "#DW persistentdw name=persistent-1a2b3c4d",
        "#DW container name=container profile=restricted-1a2b3c4d DW_JOB_foo_local_storage=container-storage DW_PERSISTENT_foo_persistent_storage=persistent-1a2b3c4d DW_GLOBAL_foo_global_lustre=/lus/maui",
    ),
    ok(
        "#DW jobdw name=container-storage type=gfs2 capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=container-storage ",
    ),
    bad(
        1,
        "needs a '#DW persistentdw name=persistent-1a2b3c4d'",
        "#DW jobdw name=container-storage type=gfs2 capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=container-storage DW_PERSISTENT_foo_persistent_storage=persistent-1a2b3c4d",
    ),
    ok(
        "#DW jobdw name=local-storage type=gfs2 capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=local-storage",
    ),
    ok(
        "#DW jobdw name=local-storage type=lustre capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=local-storage",
    ),
    ok(
        "#DW jobdw name=local-storage type=raw capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=local-storage",
    ),
    bad(
        1,
        "is xfs storage (directive 0)",
        "#DW jobdw name=local-storage type=xfs capacity=1GB",
        "#DW container name=container profile=pp DW_JOB_foo_local_storage=local-storage",
    ),
    ok(
        "#DW persistentdw name=persistent-x1",
        "#DW container name=container profile=pp DW_PERSISTENT_foo_persistent_storage=persistent-x1",
    ),
    ok("#DW jobdw name=jobdw-xfs type=xfs requires=copy-offload capacity=1GiB"),
    ok("#DW create_persistent name=persistent-lustre type=lustre"),
]

# ---------------------------------------------------------------------------------------
# DataWorkflowServices/dws-test-driver: config/dws/test-ruleset.yaml (action required,
# message and severity optional, no patterns), internal/controller/workflow_controller.go
# (action complete|wait|error as written; message "_" shown as " "; severity through
# SeverityStringToStatus, which lower-cases it, "" meaning Minor), config/samples, and the
# controller's tests.
TEST_DRIVER = [
    ok("#DW Setup action=wait"),
    ok("#DW DataIn action=error message=sample_data_error severity=Fatal"),
    ok("#DW Proposal action=complete"),
    ok("#DW Proposal action=error message=deans_error severity=Major"),
    ok("#DW Proposal action=wait"),
    *[
        ok(f"#DW {s} action={a}")
        for s in ("Proposal", "Setup", "DataIn", "PreRun", "PostRun", "DataOut", "Teardown")
        for a in ("wait", "complete", "error")
    ],
    *[
        ok(f"#DW {s} action=error message=failed_in_{s.lower()}")
        for s in ("Setup", "PreRun", "Teardown")
    ],
    ok("#DW PreRun action=error severity=fatal"),
    ok("#DW PreRun action=error severity=MAJOR"),
    ok("#DW PreRun action=error severity=mInOr message=x"),
    ok("#DW PreRun action=error severity="),
    ok("#DW PreRun action=error message="),
    ok("#DW PreRun action=error message=a=b"),
    ok("#DW PreRun action=wait message=hello severity=Fatal"),
    ok("#DW PreRun action=complete message= severity=minor"),
    ok("#DW PreRun severity=Major message=m action=error"),
    ok(
        "#DW jobdw type=xfs capacity=1GB name=ab",
        "#DW PostRun action=error message=disk_full severity=Fatal",
    ),
    ok("#DW PreRun action=wait", "#DW PreRun action=error"),
    # the rule keys are unanchored patterns: DWS admits keys that contain the words
    ok("#DW PreRun action=wait my_message=x actions=y severity_level=z"),
    bad(0, "unknown key 'mesage'", "#DW PreRun action=wait mesage=x"),
    # DWS admits these too, but the driver never acts on an action it does not know (the
    # workflow would wait forever): refused at submit
    bad(0, "missing required key 'action'", "#DW PreRun actions=wait"),
    bad(0, "missing required key 'action'", "#DW PreRun message=x"),
    bad(0, "action='Complete'", "#DW PreRun action=Complete"),
    bad(0, "action='fail'", "#DW PreRun action=fail"),
    bad(0, "key 'action' has an empty value", "#DW PreRun action="),
    bad(0, "'action' is not key=value", "#DW PreRun action"),
    bad(0, "'message' is not key=value", "#DW PreRun action=error message"),
    bad(0, "severity='critical'", "#DW PreRun action=error severity=critical"),
    bad(0, "word 'on'", "#DW PreRun action=error message=disk on fire"),
    bad(0, "'action' is given twice", "#DW PreRun action=wait action=error"),
    bad(0, "did you mean PreRun?", "#DW prerun action=wait"),
    bad(0, "unknown command 'Completed'", "#DW Completed action=wait"),
]

# ---------------------------------------------------------------------------------------
# flux-framework/flux-coral2: t/t1002-dws-workflow-obj.t, t/t1000-dws-dependencies.t,
# t/data/workflow-obj/two_directives.json, t/data/breakdown/*.yaml, doc/guide/rabbit.rst,
# doc/man5/flux-config-rabbit.rst.  Jobs that fail there at DataIn (a path that does not
# exist) are accepted at submit.
FLUX_CORAL2 = [
    ok("#DW jobdw capacity=10GiB type=xfs name=project1"),
    ok("#DW jobdw capacity=10GiB type=xfs \n\t\tname=project1"),
    ok(
        "#DW jobdw capacity=10GiB type=gfs2 name=project1\n\t\t\trequires=copy-offload\n\t\t\t#DW container name=copyoff-container profile=flux-test-copyoffload\n\t\t\tDW_JOB_my_storage=project1"
    ),
    ok("#DW jobdw capacity=1000TiB type=xfs name=project1"),
    ok(
        "\n\t#DW jobdw capacity=10GiB type=xfs name=project1\n\n\t#DW jobdw capacity=20GiB type=gfs2 name=project2"
    ),
    ok(
        "#DW jobdw capacity=10GiB type=xfs name=project1 \t\t\t#DW jobdw capacity=20GiB type=gfs2 name=project2"
    ),
    ok(
        "#DW jobdw capacity=10GiB type=xfs name=project1",
        "#DW jobdw capacity=10GiB type=lustre name=project2",
    ),
    ok(
        "#DW jobdw capacity=10GiB type=lustre name=project2 #DW copy_in source=/some/fake/dir destination=$DW_JOB_project2/"
    ),
    ok(
        "#DW jobdw capacity=10GiB type=lustre name=project3 #DW copy_out source=$DW_JOB_project3/ destination=/some/fake/dir"
    ),
    ok(
        "#DW jobdw capacity=10GiB type=xfs name=project1\n\t\t#DW copy_in source=/some/fake/dir destination=$DW_JOB_project1/"
    ),
    ok("#DW create_persistent capacity=10GiB type=lustre name=project1"),
    ok("#DW persistentdw name=project1"),
    ok("#DW destroy_persistent name=project1"),
    ok("#DW create_persistent type=lustre name=mgtpooltest profile=mypoolprofile"),
    ok(
        "#DW jobdw capacity=50GiB type=xfs name=project1\n#DW jobdw capacity=20GiB type=gfs2 name=project2\n#DW jobdw capacity=30GiB type=raw name=project3\n#DW jobdw capacity=10GiB type=lustre name=project4"
    ),
    ok(
        "#DW jobdw capacity=150GiB type=gfs2 name=project1 #DW jobdw capacity=150GiB type=gfs2 name=project2"
    ),
    ok("#DW jobdw type=lustre capacity=10GiB name=project1 profile=osts-count-2"),
    ok("#DW jobdw type=xfs capacity=256GiB name=xfssmall"),
    ok("#DW jobdw type=lustre capacity=10TiB name=lustrelarge"),
    ok(
        "#DW jobdw type=xfs capacity=10GiB name=project1\n#DW copy_in source=/p/lustre1/$USER/dir_in destination=$DW_JOB_project1/\n#DW copy_out source=$DW_JOB_project1/ destination=/p/lustre1/$USER/dir_out/"
    ),
    ok(
        "#DW jobdw type=lustre capacity=100GiB name=lustreproject",
        "#DW copy_out source=$DW_JOB_lustreproject destination=/p/lustre1/$USER/lustreproject_results",
    ),
    ok("#DW jobdw type=lustre capacity=50TiB name=largelustre"),
    bad(0, "does not start with #DW", "foo"),
    bad(0, "does not start with #DW", "foo_test"),
    bad(0, "unknown command 'foo'", "#DW foo #DW bar"),
    bad(
        1,
        "names no jobdw directive",
        "#DW jobdw capacity=10GiB type=xfs name=project1",
        "#DW copy_in source=/p/in destination=$DW_JOB_project2/",
    ),
]

# ---------------------------------------------------------------------------------------
# The NNF user guide: NearNodeFlash/NearNodeFlash.github.io docs/guides/user-interactions/
# readme.md ("Any '-' in the name ... should be changed to a '_' in the copy_in and
# copy_out directive") and docs/guides/data-movement/copy-offload.md.
USER_GUIDE = [
    ok("#DW jobdw type=xfs capacity=10GiB name=scratch"),
    ok("#DW jobdw type=lustre capacity=1TB name=dw-temp profile=high-metadata"),
    ok("#DW jobdw type=gfs2 capacity=50GB name=checkpoint requires=copy-offload"),
    ok("#DW create_persistent type=xfs capacity=100GiB name=scratch"),
    ok("#DW create_persistent type=lustre capacity=10TiB name=shared-data profile=read-only"),
    ok("#DW destroy_persistent name=shared-data"),
    ok("#DW persistentdw name=shared-data requires=copy-offload"),
    # the three copy_in/copy_out examples
    ok(
        "#DW jobdw type=xfs capacity=10GiB name=fast-storage\n"
        "#DW copy_in source=/lus/backup/johndoe/important_data destination=$DW_JOB_fast_storage/data"
    ),
    ok(
        "#DW persistentdw name=shared-data1\n#DW persistentdw name=shared-data2\n\n"
        "#DW copy_out source=$DW_PERSISTENT_shared_data1/a destination=$DW_PERSISTENT_shared_data2/a profile=no-xattr\n"
        "#DW copy_out source=$DW_PERSISTENT_shared_data1/b destination=$DW_PERSISTENT_shared_data2/b profile=no-xattr"
    ),
    ok(
        "#DW persistentdw name=shared-data\n"
        "#DW jobdw type=lustre capacity=1TiB name=fast-storage profile=high-metadata\n\n"
        "#DW copy_in source=/lus/shared/johndoe/shared-libraries destination=$DW_JOB_fast_storage/libraries\n"
        "#DW copy_in source=$DW_PERSISTENT_shared_data/ destination=$DW_JOB_fast_storage/data\n\n"
        "#DW copy_out source=$DW_JOB_fast_storage/data destination=/lus/backup/johndoe/very_important_data profile=no-xattr"
    ),
    # the guide's container example puts it on xfs, which nnf-sos refuses in Proposal
    # ("unsupported container filesystem", nnf_workflow_controller_test.go)
    bad(
        1,
        "is xfs storage",
        "#DW jobdw type=xfs capacity=10GiB name=fast-storage",
        "#DW container name=backup profile=automatic-backup DW_JOB_source=fast-storage DW_GLOBAL_destination=/lus/backup/johndoe",
    ),
    ok(
        "#DW jobdw type=gfs2 capacity=10GiB name=my-job-name requires=copy-offload",
        "#DW container name=copyoff-container profile=copy-offload-default",
    ),
    # the example: a name with '-' referenced with '_'; a miss names it as written
    ok(
        "#DW jobdw type=xfs capacity=10GiB name=fast-store",
        "#DW copy_in source=/lus/in destination=$DW_JOB_fast_store/",
    ),
    bad(
        1,
        "'$DW_JOB_fast_stor/'",
        "#DW jobdw type=xfs capacity=10GiB name=fast-store",
        "#DW copy_in source=/lus/in destination=$DW_JOB_fast_stor/",
    ),
]

GROUPS = {
    "dwdparse_test": DWDPARSE,
    "dwdparse_words": DWDPARSE_WORDS,
    "nnf_ruleset": NNF_RULESET,
    "nnf_proposal": NNF_PROPOSAL,
    "nnf_integration": INTEGRATION,
    "nnf_workflow": NNF_WORKFLOW,
    "test_driver": TEST_DRIVER,
    "flux_coral2": FLUX_CORAL2,
    "user_guide": USER_GUIDE,
}
CASES = [
    pytest.param(case, id=f"{group}-{i}")
    for group, cases in GROUPS.items()
    for i, case in enumerate(cases)
]


@pytest.mark.parametrize("case", CASES)
def test_case(case: Case) -> None:
    if case.error is None:
        parsed = parse_directives(case.directives)
        assert parsed and parse_directives([d.text for d in parsed]) == parsed
        return
    index, part = case.error
    with pytest.raises(DirectiveError) as info:
        parse_directives(case.directives)
    message = str(info.value)
    assert "\n" not in message
    if not message.startswith("no #DW directives given"):
        assert message.startswith(f"#DW directive {index}"), message
    assert part in message, (part, message)


# ---------------------------------------------------------------------------------------
# The create-time half, checked against the stand-in DWS webhook (flux_dws.testing.ruleset:
# dwdparse's reading of the nnf and test-driver rulesets as data): whatever flux-dws accepts,
# DWS admits.  What DWS admits but flux-dws refuses must be a Proposal rule of nnf-sos (or a
# test-driver action that would never end), so the error then names such a reason.
ACCEPTED = [p for p in CASES if p.values[0].error is None]
REFUSED = [p for p in CASES if p.values[0].error is not None]


@pytest.mark.parametrize("case", ACCEPTED)
def test_what_flux_dws_accepts_dws_admits(case: Case) -> None:
    assert admission_error(list(split_directives(case.directives))) is None


PROPOSAL_REASONS = (
    "only #DW directive",
    "only one container directive",
    "names no jobdw directive",
    "needs a '#DW persistentdw",
    "needs a persistentdw directive",
    "storage (directive",
    "is not a valid name",  # a copy path or a container value naming no storage of the job
    "must be an absolute path",  # a path in no global Lustre file system
    "must be more than zero",
    "is too large",
    "has an empty value",  # source=, DW_JOB_x=: no storage has that name
    "action=",  # test driver: an action it does not act on (DWS admits it)
    "severity=",  # test driver: a severity it cannot read
    "missing required key 'action'",  # "actions=wait": DWS admits, the driver never acts
)


@pytest.mark.parametrize("case", REFUSED)
def test_what_dws_admits_flux_dws_refuses_only_for_a_later_rule(case: Case) -> None:
    try:
        lines = list(split_directives(case.directives))
    except DirectiveError:
        return  # no directive at all, or text before the first #DW: DWS never sees it
    if admission_error(lines) is not None:
        return
    with pytest.raises(DirectiveError) as info:
        parse_directives(case.directives)
    assert any(reason in str(info.value) for reason in PROPOSAL_REASONS), str(info.value)


# DataWorkflowServices/dws utils/dwdparse/dwdparse_test.go, against the stand-in's engine.
@pytest.mark.parametrize(
    "directives, error",
    [
        (["#DW jobdw type=xfs capacity=1GB name=ab"], None),
        (["#DW jobd type=xfs"], "invalid directive '#DW jobd type=xfs'"),
        (["  jobdw type=xfs"], "missing '#DW' prefix in directive '  jobdw type=xfs'"),
        (["#DW jobdw type=xfs type=raw"], "repeated argument 'type' in directive"),
        (["#DW jobdw tye=xfs"], "unsupported argument 'tye'"),
        (["#DW jobdw type=xfs capacity=1GB name=ab profile"], "argument 'profile' requires value"),
        (["#DW jobdw type=file capacity=1GB name=ab"], "argument 'type' invalid string 'file'"),
        (["#DW jobdw type=xfs name=ab"], "missing required argument '^capacity$'"),
        (
            ["#DW persistentdw name=ab requires=none-such,copy-offload"],
            "argument 'requires' invalid string 'none-such' in list",
        ),
        (["#DW persistentdw name=ab requires=copy-offload,copy-offload"], "repeated in list"),
        (
            ["#DW jobdw type=xfs capacity=1GB name=ab", "#DW jobdw type=raw capacity=1GB name=ab"],
            "value 'ab' must be unique within 'jobdw_name'",
        ),
        (["#DW container name=ab profile=pp DW_JOB_x=y"], "unsupported argument 'DW_JOB_x'"),
        (["#DW container name=ab profile=pp DW_JOB_xy="], None),  # no pattern: nnf-sos refuses
        (["#DW copy_in source= destination="], None),  # likewise, in Proposal
        (["#DW PreRun action=anything my_message"], "argument 'my_message' requires value"),
        (["#DW PreRun actions=wait"], None),  # an unanchored key pattern
        (["#DW PreRun action=wait message= severity="], None),
        (["#DW PreRun message=x"], "missing required argument 'action'"),
        (["#DW capacity=1\x1cGB"], "invalid directive"),  # \x1c is no white space to Go
    ],
)
def test_stand_in_webhook_reads_directives_as_dwdparse(directives, error) -> None:
    found = admission_error(directives)
    if error is None:
        assert found is None
    else:
        assert found is not None and error in found, found


NAMES = ["ab", "cd", "a-b", "a_b", "Ab", "a", ""]
VALUES = {
    "type": ["xfs", "gfs2", "raw", "lustre", "Xfs", ""],
    "capacity": ["1GiB", "10TB", "0GB", "1.5TB", "10G", ""],
    "name": NAMES,
    "profile": ["p1", "p-2", "P1", ""],
    "requires": ["copy-offload", "user-container-auth,copy-offload", "copy-offload,", ""],
    "source": [
        "/a",
        "",
        "a",
        "$DW_JOB_ab/x",
        "$DW_JOB_a_b",
        "$DW_PERSISTENT_cd",
        "$DW_PERSISTENT_a_b/y",
    ],
    "action": ["wait", "complete", "error", "Wait", ""],
    "message": ["m", "", "a=b"],
    "severity": ["FATAL", "minor", "", "bad"],
    "DW_JOB_ab": NAMES,
    "DW_PERSISTENT_xy": NAMES,
    "DW_GLOBAL_gl": ["/g", "g", ""],
}
VALUES["destination"] = VALUES["source"]
KEYS = {
    "jobdw": ["type", "capacity", "name", "profile", "requires"],
    "persistentdw": ["name", "requires"],
    "create_persistent": ["type", "capacity", "name", "profile"],
    "destroy_persistent": ["name"],
    "container": ["name", "profile", "DW_JOB_ab", "DW_PERSISTENT_xy", "DW_GLOBAL_gl"],
    "copy_in": ["source", "destination", "profile"],
    "copy_out": ["source", "destination", "profile"],
    "PreRun": ["action", "message", "severity"],
    "Proposal": ["action", "message", "severity"],
}
ODD_WORDS = ["name", "profile=p1", "my_message=x", "command=x", "=x", "x=", "DW_JOB_a=ab"]


@st.composite
def directive_lists(draw):
    """Directive lists that are mostly well formed, so that many are accepted."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        command = draw(st.sampled_from(sorted(KEYS)))
        keys = [k for k in KEYS[command] if draw(st.integers(0, 3))]  # each key 3 times in 4
        found = [f"{k}={draw(st.sampled_from(VALUES[k][:2] * 6 + VALUES[k]))}" for k in keys]
        if draw(st.integers(0, 5)) == 0:
            found.append(draw(st.sampled_from(ODD_WORDS)))
        lines.append(" ".join(["#DW", command, *draw(st.permutations(found))]))
    return lines


@settings(max_examples=400, deadline=None)
@given(directive_lists())
def test_never_accepts_what_the_dws_webhook_refuses(lines: list[str]) -> None:
    refused = admission_error(lines)
    try:
        parse_directives(lines)
    except DirectiveError as exc:
        if refused is None:  # then only a rule nnf-sos applies later may refuse it
            assert any(reason in str(exc) for reason in PROPOSAL_REASONS), (lines, str(exc))
    else:
        assert refused is None, (lines, refused)
