"""`peerd check-config JOB.toml`: a job file checked, and the LR law it puts in
force in the words the worker's log and peerctl status use, with the factor it
gives the job's global batches (docs/operations.md, "Running the daemon")."""

from __future__ import annotations

import textwrap

import pytest

from peerd.cli.daemon import main


def check(tmp_path, capsys, body: str, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(body))
    code = main(["check-config", *extra, str(path)])
    out, err = capsys.readouterr()
    return code, out.replace(str(path), "JOB"), err.replace(str(path), "JOB")


def test_a_script_jobs_law_its_ramp_and_the_factor_by_workers(tmp_path, capsys):
    code, out, _ = check(tmp_path, capsys, """
        [job]
        name = "tuned"
        script = "train.py"
        local_batch = 32
        [optimizer]
        reference_batch = 32
    """)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "JOB: valid: job 'tuned' (script train.py)"
    assert lines[1] == ("LR: sqrt law against the reference batch 32, cap 2; a change of the factor by r ramps "
                        "over 8·max(r, 1/r) steps")
    assert lines[2].endswith("1 → 1.000 (global batch 32), 2 → 1.414 (global batch 64), 4 → 2.000 (global batch "
                             "128), 8 → 2.000 (global batch 256, capped), 16 → 2.000 (global batch 512, capped)")
    assert "a script that accumulates: times its micro-batches per step" in lines[2]


@pytest.mark.parametrize("optimizer, said", [
    ('reference_batch = 32\nscaling = "none"',
     'LR: no scaling: the script\'s LR exactly ([optimizer] scaling = "none")'),
    ("", "LR: no scaling: the script's LR exactly ([optimizer] reference_batch = 0)"),
])
def test_no_scaling_is_the_scripts_lr_exactly(tmp_path, capsys, optimizer, said):
    code, out, _ = check(tmp_path, capsys, f'[job]\nname = "plain"\nscript = "train.py"\n[optimizer]\n{optimizer}\n')
    assert code == 0 and out.splitlines()[1:] == [said]


def test_with_dbs_the_factor_of_the_target_global_batch(tmp_path, capsys):
    code, out, _ = check(tmp_path, capsys, """
        [job]
        name = "dbs"
        module = "mylab.jobs.cells"
        global_batch = 96
        [optimizer]
        reference_batch = 32
        scaling = "linear"
        max_scale = inf
        ramp_steps = 0
    """)
    assert code == 0 and out.splitlines()[1:] == [
        "LR: linear law against the reference batch 32, no cap; a change of the factor jumps at once",
        "LR factor at the DBS target ([job] global_batch = 96): 3.000 (global batch 96)"]


def test_a_bad_job_file_is_named_with_its_key_and_exits_2(tmp_path, capsys):
    code, out, err = check(tmp_path, capsys, '[job]\nname = "x"\nscript = "t.py"\n[optimizer]\nscaling = "cubic"\n')
    assert code == 2 and out == "" and err.startswith("peerd: JOB") and "cubic" in err


def test_with_config_the_daemons_config_is_checked_too(tmp_path, capsys):
    config = tmp_path / "peerd.toml"
    config.write_text("[daemon]\npeer_port = 70000\n")
    code, out, err = check(tmp_path, capsys, '[job]\nname = "x"\nscript = "t.py"\n', "--config", str(config))
    assert code == 2 and out.startswith("JOB: valid") and "daemon.peer_port" in err


def test_the_outer_step_in_force_is_said_after_the_law(tmp_path, capsys):
    code, out, _ = check(tmp_path, capsys, '[job]\nname = "local-sgd"\nscript = "train.py"\n[outer]\nevery = 8\n')
    assert code == 0 and out.splitlines()[2:] == [
        'outer SGD every 8 local steps: lr 0.7, Nesterov momentum 0.5, after each round (docs/algorithms.md, '
        '"The outer step")']
    code, out, _ = check(tmp_path, capsys, '[job]\nname = "plain"\nscript = "train.py"\n')
    assert code == 0 and "outer" not in out
