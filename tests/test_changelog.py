"""Changelog framing: round trips, and refusal of foreign, truncated or corrupt files."""
import pytest

from keyedstate import changelog as cl


def sample():
    return cl.encode(7, 128, [(cl.OP_PUT, b"\x00\x00\x00\x01k1", b"\x01v1"),
                              (cl.OP_DELETE, b"\x00\x00\x00\x02k2", None),
                              (cl.OP_PUT, b"\x00\x00\x00\x03k3", b"")])


def test_round_trip():
    log = cl.decode(sample(), "mem")
    assert (log.version, log.key_groups, log.record_count) == (7, 128, 3)
    assert list(log.records()) == [(cl.OP_PUT, b"\x00\x00\x00\x01k1", b"\x01v1"),
                                   (cl.OP_DELETE, b"\x00\x00\x00\x02k2", None),
                                   (cl.OP_PUT, b"\x00\x00\x00\x03k3", b"")]


@pytest.mark.parametrize("cut", [1, 5, 13, 20])
def test_truncated_file_is_rejected_with_its_name(cut):
    data = sample()
    with pytest.raises(cl.CorruptChangelogError, match="/ckpt/3.ks-changelog"):
        cl.decode(data[:-cut], "/ckpt/3.ks-changelog")


def test_flipped_byte_fails_the_checksum():
    data = bytearray(sample())
    data[30] ^= 0x40
    with pytest.raises(cl.CorruptChangelogError, match="CRC"):
        cl.decode(bytes(data), "x")


def test_foreign_file_is_named_as_foreign():
    with pytest.raises(cl.CorruptChangelogError, match="not a keyedstate changelog"):
        cl.decode(b"\x00\x00\x00\x10some HDFS delta bytes", "/ckpt/1.delta")


def test_empty_version_round_trips():
    log = cl.decode(cl.encode(1, 5, []), "x")
    assert log.record_count == 0 and list(log.records()) == []
