"""crc32c.py: the definition against the standard check values, then each faster form against it."""
import numpy as np
import pytest

from plumbing import crc32c

# Known answers, from RFC 3720 (iSCSI), appendix B.4, and the usual check string.
KNOWN = [(b"123456789", 0xE3069283), (bytes(32), 0x8A9136AA), (b"\xff" * 32, 0x62A8AB43),
         (bytes(range(32)), 0x46DD794E), (bytes(range(31, -1, -1)), 0x113FDB5C), (b"", 0)]


def reference_crc32c(data):
    """The definition, written out again here so the test does not trust the module's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize("data, crc", KNOWN)
def test_crc32c_definition_gives_the_known_answers(data, crc):
    assert crc32c.crc32c(data) == crc, f"crc32c({data[:9]!r}...) should be {crc:#010x}"
    assert reference_crc32c(data) == crc


def test_the_byte_table_is_eight_shifts_of_the_definition():
    for i in (0, 1, 0x80, 0xFF, 0x5A):
        state = i
        for _ in range(8):
            state = (state >> 1) ^ 0x82F63B78 if state & 1 else state >> 1
        assert crc32c.TABLE[i] == state


@pytest.mark.parametrize("n", [0, 1, 3, 4, 7, 1000, 8191, 8192, 16384 + 5, 100_003])
def test_crc32c_matches_the_definition_at_every_length(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    want = reference_crc32c(data.tobytes())
    if n <= 16384 + 5:  # the bit-by-bit definition is slow
        assert crc32c.crc32c(data) == want
    assert crc32c.crc32c_by_bytes(data) == want
    assert crc32c.crc32c_fast(data) == want


def test_crc32c_of_a_float_array_is_over_its_bytes():
    x = np.arange(5000, dtype=np.float32)
    assert crc32c.crc32c_fast(x) == reference_crc32c(x.tobytes())


def test_masked_crc32c():
    c = reference_crc32c(b"abc")
    assert crc32c.masked_crc32c(b"abc") == ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
