"""CRC-32C, the checksum TensorFlow puts on every block of a checkpoint's index and on
every tensor: first its definition, one bit at a time, then the same function fast.

A CRC is the remainder of a polynomial division over GF(2): the message's bits are
the coefficients, and the divisor is the Castagnoli polynomial (0x1EDC6F41; written
bit-reversed, 0x82F63B78, because the bits are fed lowest first). Python's
zlib.crc32 uses another polynomial, so it gives other numbers.

    crc32c           the definition: 8 shifts a byte
    crc32c_by_bytes  one table look-up a byte, the table made from the definition
    crc32c_fast      65,536 lanes at once with NumPy, then folded into one (how fast each
                     is: docs/performance.md)

A test holds all three equal on every length; `masked_crc32c` is the form TensorFlow stores.
"""
import functools

import numpy as np

POLYNOMIAL = 0x82F63B78  # Castagnoli's, bit-reversed


def crc32c(data):
    """The definition. The register starts all ones; each bit of each byte (lowest first)
    is shifted in, and when a 1 falls out the polynomial is subtracted (XOR in GF(2));
    the result is inverted. crc32c(b"123456789") == 0xE3069283, the standard check."""
    crc = 0xFFFFFFFF
    for byte in bytes(data):
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ POLYNOMIAL if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def byte_table():
    """TABLE[i]: what the 8 shifts of crc32c do to a register whose low byte is i
    (and the rest zero). Because a CRC is linear, a whole byte is then one look-up."""
    c = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        c = np.where(c & 1, (c >> 1) ^ np.uint32(POLYNOMIAL), c >> 1)
    return c


TABLE = byte_table()
TABLE_LIST = TABLE.tolist()  # Python ints: faster in a Python loop than NumPy scalars


def update_by_bytes(state, data):
    """Feed bytes into the register `state`, one table look-up a byte."""
    for byte in bytes(data):
        state = TABLE_LIST[(state ^ byte) & 0xFF] ^ (state >> 8)
    return state


def crc32c_by_bytes(data):
    """CRC-32C, a byte at a time: the same result as crc32c."""
    return update_by_bytes(0xFFFFFFFF, data) ^ 0xFFFFFFFF


# The fast version. A Python loop over 500 MB would take a minute, so we cut the data
# into many equal lanes, run the CRC over all lanes at once (4 bytes a step, two table
# look-ups of 16 bits each), then fold the lanes' CRCs together. The fold works because
# a CRC is linear:
#   crc(state, A + B) = zeros(state, len(B)) ^ crc(0, B)
# where zeros(s, n), the effect of n zero bytes on state s, is a 32x32 bit matrix.

def word_tables(t):
    """LOW, HIGH such that feeding a 4-byte word w into state s gives
    LOW[x & 0xFFFF] ^ HIGH[x >> 16], x = s ^ w. Byte k of x is followed by 3 - k
    more bytes, hence the tables 'byte, then n zero bytes'."""
    after = [t]  # after[n][i]: byte i followed by n zero bytes
    for _ in range(3):
        after.append((after[-1] >> 8) ^ t[after[-1] & 0xFF])
    low = (after[3][None, :] ^ after[2][:, None]).ravel()  # index: byte1 * 256 + byte0
    high = (after[1][None, :] ^ after[0][:, None]).ravel()  # index: byte3 * 256 + byte2
    return low, high


LOW, HIGH = word_tables(TABLE)


def apply(op, x):
    """Apply a linear map on 32-bit states, given as the images of its 32 bits, to x (uint32 array)."""
    out = np.zeros_like(x)
    for bit in range(32):
        out ^= op[bit] * ((x >> np.uint32(bit)) & np.uint32(1))
    return out


@functools.lru_cache(maxsize=None)
def zeros_operator(n):
    """The map state -> state after n zero bytes, as the images of the 32 bits."""
    if n == 1:
        bits = np.uint32(1) << np.arange(32, dtype=np.uint32)
        return TABLE[bits & 0xFF] ^ (bits >> 8)
    half = zeros_operator(n // 2)
    op = apply(half, half)
    return apply(zeros_operator(1), op) if n % 2 else op


def update_in_lanes(state, data):
    """Feed the bytes of data (a uint8 array) into the CRC register `state`, in lanes."""
    lanes = 1
    while lanes < 1 << 16 and lanes * 2 * 1024 <= len(data):
        lanes *= 2
    if lanes < 8:  # short data: lanes would not pay for their folding
        return update_by_bytes(state, data.tobytes())
    length = len(data) // lanes // 4 * 4
    words = data[:lanes * length].view("<u4").reshape(lanes, length // 4)
    crc = np.zeros(lanes, np.uint32)
    for j in range(length // 4):
        crc ^= words[:, j]
        crc = LOW[crc & 0xFFFF] ^ HIGH[crc >> 16]
    while len(crc) > 1:  # fold neighbouring lanes: crc(A + B) = zeros(crc(A), len(B)) ^ crc(B)
        crc = apply(zeros_operator(length), crc[0::2]) ^ crc[1::2]
        length *= 2
    # now `length` covers all lanes; the few bytes after them go round again
    state = int(apply(zeros_operator(length), np.array([state], np.uint32))[0] ^ crc[0])
    return update_in_lanes(state, data[length:])


def crc32c_fast(data):
    """CRC-32C of a bytes-like object or an array (over its bytes): crc32c, fast."""
    data = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
    return update_in_lanes(0xFFFFFFFF, data.reshape(-1).view(np.uint8)) ^ 0xFFFFFFFF


def masked_crc32c(data):
    """The form TensorFlow stores: rotate right by 15 bits, add a constant (mod 2^32).
    (A CRC of data that holds its own CRC is degenerate; the mask avoids that.)"""
    c = crc32c_fast(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF
