import pytest

from lightning_hetero import _cgroup
from lightning_hetero._cgroup import Cgroup, controller_dir, read_int, read_limit, read_stat


def write_files(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


# ---------------------------------------------------------------- finding the directory


@pytest.mark.parametrize("controller", ["cpu", "memory"])
def test_v2_files_lie_in_the_root(tmp_path, controller):
    write_files(tmp_path, {f"{controller}.max": "max\n"})
    assert controller_dir(controller, tmp_path) == Cgroup(tmp_path, 2)


@pytest.mark.parametrize("controller", ["cpu", "memory"])
def test_v1_files_lie_in_the_controllers_directory(tmp_path, controller):
    (tmp_path / controller).mkdir()
    assert controller_dir(controller, tmp_path) == Cgroup(tmp_path / controller, 1)


def test_v2_wins_over_a_directory_named_like_the_controller(tmp_path):
    write_files(tmp_path, {"memory.max": "max\n", "memory/memory.limit_in_bytes": "1\n"})
    assert controller_dir("memory", tmp_path) == Cgroup(tmp_path, 2)


def test_each_controller_is_found_on_its_own(tmp_path):
    write_files(tmp_path, {"cpu.max": "max 100000\n"})
    assert controller_dir("cpu", tmp_path) == Cgroup(tmp_path, 2)
    assert controller_dir("memory", tmp_path) is None


def test_no_cgroup_files_is_none(tmp_path):
    assert controller_dir("cpu", tmp_path) is None
    assert controller_dir("memory", tmp_path / "missing") is None


def test_the_default_root_is_the_system_one():
    assert str(_cgroup.DEFAULT_ROOT) == "/sys/fs/cgroup"


# ---------------------------------------------------------------- values


def test_read_int_reads_a_field(tmp_path):
    write_files(tmp_path, {"cpu.max": "150000 100000\n", "memory.current": "4096\n"})
    assert read_int(tmp_path / "memory.current") == 4096
    assert read_int(tmp_path / "cpu.max") == 150000
    assert read_int(tmp_path / "cpu.max", field=1) == 100000


def test_read_int_is_none_for_a_missing_file_or_field(tmp_path):
    write_files(tmp_path, {"cpu.max": "150000\n"})
    assert read_int(tmp_path / "cpu.max", field=1) is None
    assert read_int(tmp_path / "memory.current") is None
    assert read_int(tmp_path) is None  # a directory is not a file


def test_read_int_rejects_text_that_is_not_a_number(tmp_path):
    write_files(tmp_path, {"memory.current": "garbage\n"})
    with pytest.raises(ValueError):
        read_int(tmp_path / "memory.current")


@pytest.mark.parametrize(
    ("text", "field", "expected"),
    [
        ("1073741824\n", 0, 2**30),  # v2 memory.max, v1 memory.limit_in_bytes
        ("50000\n", 0, 50000),  # v1 cpu.cfs_quota_us
        ("150000 100000\n", 0, 150000),  # v2 cpu.max: the quota
        ("0\n", 0, 0),  # a limit of nothing is a limit
        ("max\n", 0, None),  # v2 memory.max without a limit
        ("max 100000\n", 0, None),  # v2 cpu.max without a quota
        ("-1\n", 0, None),  # v1 cpu.cfs_quota_us without a quota
        (f"{2**63 - 4096}\n", 0, None),  # v1 memory.limit_in_bytes without a limit
        (f"{2**60}\n", 0, None),
        (f"{2**60 - 1}\n", 0, 2**60 - 1),
        ("150000\n", 1, None),  # no such field
        ("", 0, None),
    ],
)
def test_read_limit(tmp_path, text, field, expected):
    write_files(tmp_path, {"limit": text})
    assert read_limit(tmp_path / "limit", field) == expected


def test_read_limit_of_a_missing_file_is_none(tmp_path):
    assert read_limit(tmp_path / "memory.max") is None


def test_read_limit_rejects_text_that_is_not_a_number(tmp_path):
    write_files(tmp_path, {"memory.max": "garbage\n"})
    with pytest.raises(ValueError):
        read_limit(tmp_path / "memory.max")


# ---------------------------------------------------------------- stat files


def test_read_stat_finds_the_exact_key(tmp_path):
    write_files(
        tmp_path,
        {"memory.stat": "anon 5\ninactive_file 7\ntotal_inactive_file 11\nfile 13\n"},
    )
    assert read_stat(tmp_path / "memory.stat", "inactive_file") == 7
    assert read_stat(tmp_path / "memory.stat", "total_inactive_file") == 11
    assert read_stat(tmp_path / "memory.stat", "file") == 13


def test_read_stat_is_none_for_a_missing_key_or_file(tmp_path):
    write_files(tmp_path, {"memory.stat": "anon 5\n"})
    assert read_stat(tmp_path / "memory.stat", "inactive_file") is None
    assert read_stat(tmp_path / "missing.stat", "anon") is None
