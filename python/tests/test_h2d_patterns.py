"""pegaflow.bench.h2d_patterns without a GPU: the copy plans' coverage and the argument checks."""

from __future__ import annotations

import pytest

from pegaflow.bench import h2d_patterns as h2d


def _covered(calls) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    host, dev = [], []
    for h, d, width, rows, pitch in calls:
        for r in range(rows):
            host.append((h + r * pitch, width))
            dev.append((d + r * width, width))
    return sorted(host), sorted(dev)


@pytest.mark.parametrize("shape", h2d.SHAPES)
def test_each_shape_moves_every_byte_once(shape):
    nbytes = 4 * h2d.BLOCK
    for side in _covered(h2d.plan(shape, nbytes)):
        at = 0
        for off, width in side:
            assert off == at, (shape, off, at)  # no gap, no overlap
            at += width
        assert at == nbytes


def test_the_pitched_shape_is_the_stagings():
    """One call per layer: that layer's 64 KiB of every block, 2 MiB apart in the host, back to
    back on the device (DeviceStager's and the bounce path's copies of a layer group)."""
    calls = h2d.plan("layers_pitched", 3 * h2d.BLOCK)
    assert len(calls) == 32
    assert calls[1] == (h2d.ROW, 3 * h2d.ROW, h2d.ROW, 3, h2d.BLOCK)
    assert h2d.plan("layers_rows_contiguous", 3 * h2d.BLOCK)[1] == (3 * h2d.ROW, 3 * h2d.ROW, h2d.ROW, 3, h2d.ROW)


def test_bad_arguments_are_refused_naming_the_value():
    with pytest.raises(ValueError, match=f"{3 * h2d.BLOCK - 1} bytes; expected a positive multiple of 2097152"):
        h2d.plan("blocks", 3 * h2d.BLOCK - 1)
    with pytest.raises(ValueError, match="shape 'rows'; expected one of one_copy"):
        h2d.plan("rows", h2d.BLOCK)
    with pytest.raises(SystemExit, match="--mib 3; expected a positive multiple of 2"):
        h2d.main(["--json", "/dev/null", "--mib", "3"])
    with pytest.raises(SystemExit, match="--memories pageable; expected some of host_alloc"):
        h2d.main(["--json", "/dev/null", "--memories", "pageable"])


def test_the_host_settings_are_read_without_a_gpu():
    settings = h2d.host_settings()
    assert set(settings) >= {"thp_enabled", "thp_shmem_enabled", "thp_defrag"}


@pytest.mark.parametrize("shape", h2d.SHAPES)
@pytest.mark.parametrize("parts", [2, 3])
def test_calls_cut_across_streams_still_move_every_byte_once(shape, parts):
    nbytes = 4 * h2d.BLOCK
    cut = []
    for h, d, width, rows, pitch in h2d.plan(shape, nbytes):
        pieces = h2d.split(h, d, width, rows, pitch, parts)
        assert 1 <= len(pieces) <= parts
        if rows > 1 or width >= parts * 4096:
            assert len(pieces) > 1, (shape, h, rows)  # each part on its own stream
        cut += [(h2, d2, w2, r2, pitch) for h2, d2, w2, r2 in pieces]
    for side in _covered(cut):
        at = 0
        for off, width in side:
            assert off == at, (shape, parts, off, at)
            at += width
        assert at == nbytes


def test_a_bad_stream_count_is_refused_naming_the_value():
    with pytest.raises(SystemExit, match="--streams 0; expected comma-separated counts from 1 to 8"):
        h2d.main(["--json", "/dev/null", "--streams", "0"])
    with pytest.raises(SystemExit, match="--streams two; expected"):
        h2d.main(["--json", "/dev/null", "--streams", "two"])
