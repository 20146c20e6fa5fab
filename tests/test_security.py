"""Authentication of the rack (issue 13, item 1): SipHash-2-4 against its published test
vectors (native and reference), the trailer's replay window, rack key files, and servers
that drop what the rack key does not sign."""

import os
import stat
import struct
import time

import pytest

from malcolm import config
from malcolm.net import _wire as native
from malcolm.net import wire

# SipHash-2-4, 64-bit output, key 00 01 .. 0f, message 00 01 .. (k-1) for k = 0..63: the
# reference test vectors of Aumasson and Bernstein (vectors.h of the reference code), as the
# little-endian bytes of the result.
VECTORS = """
310e0edd47db6f72 fd67dc93c539f874 5a4fa9d909806c0d 2d7efbd796666785
b7877127e09427cf 8da699cd64557618 cee3fe586e46c9cb 37d1018bf50002ab
6224939a79f5f593 b0e4a90bdf82009e f3b9dd94c5bb5d7a a7ad6b22462fb3f4
fbe50e86bc8f1e75 903d84c02756ea14 eef27a8e90ca23f7 e545be4961ca29a1
db9bc2577fcc2a3f 9447be2cf5e99a69 9cd38d96f0b3c14b bd6179a71dc96dbb
98eea21af25cd6be c7673b2eb0cbf2d0 883ea3e395675393 c8ce5ccd8c030ca8
94af49f6c650adb8 eab8858ade92e1bc f315bb5bb835d817 adcf6b0763612e2f
a5c91da7acaa4dde 716595876650a2a6 28ef495c53a387ad 42c341d8fa92d832
ce7cf2722f512771 e37859f94623f3a7 381205bb1ab0e012 ae97a10fd434e015
b4a31508beff4d31 81396229f0907902 4d0cf49ee5d4dcca 5c73336a76d8bf9a
d0a704536ba93e0e 925958fcd6420cad a915c29bc8067318 952b79f3bc0aa6d4
f21df2e41d4535f9 87577519048f53a9 10a56cf5dfcd9adb eb75095ccd986cd0
51a9cb9ecba312e6 96afadfc2ce666c7 72fe52975a4364ee 5a1645b276d592a1
b274cb8ebf87870a 6f9bb4203de7b381 eaecb2a30b22a87f 9924a43cc1315724
bd838d3aafbf8db7 0b1a2a3265d51aea 135079a3231ce660 932b2846e4d70666
e1915f5cb1eca46c f325965ca16d629f 575ff28e60381be5 724506eb4c328a95
""".split()
KEY16 = bytes(range(16))


def test_siphash_reference_and_native_match_the_published_vectors():
    assert len(VECTORS) == 64
    for k, want in enumerate(VECTORS):
        msg = bytes(range(k))
        assert struct.pack("<Q", wire.siphash24(KEY16, msg)).hex() == want, k
        assert struct.pack("<Q", native.siphash24(KEY16, msg)).hex() == want, k


def test_siphash_native_equals_reference_on_long_and_odd_inputs():
    import random
    rng = random.Random(5)
    for n in (0, 7, 8, 9, 63, 64, 65, 1000, 4031):
        key = bytes(rng.randrange(256) for _ in range(16))
        data = bytes(rng.randrange(256) for _ in range(n))
        assert wire.siphash24(key, data) == native.siphash24(key, data)


def test_replay_window():
    w = native.ReplayWindow()
    assert w.check(10, 1) == 1                  # first epoch: a join
    assert w.check(10, 1) == wire.E_REPLAY      # the same message again
    assert w.check(10, 5) == 0
    assert w.check(10, 3) == 0                  # reordered, inside the window: once
    assert w.check(10, 3) == wire.E_REPLAY
    assert w.check(10, 200) == 0
    assert w.check(10, 200 - 64) == wire.E_REPLAY   # too far behind
    assert w.check(10, 200 - 63) == 0
    assert w.check(9, 500) == wire.E_EPOCH      # an older epoch: a replay of a past run
    assert w.check(11, 1) == 1                  # a restart: accepted at once
    assert w.check(10, 201) == wire.E_EPOCH


def test_epochs_grow_across_starts():
    a = native.new_epoch()
    time.sleep(0.002)
    b = native.new_epoch()
    assert b > a


def test_key_files(tmp_path, monkeypatch):
    monkeypatch.delenv(config.KEY_ENV, raising=False)
    p = tmp_path / "rack.key"
    config.write_key(str(p))
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o600 and len(p.read_bytes()) == 32
    k = config.read_key(str(p))
    assert len(k) == 16 and k == config.read_key(str(p))
    with pytest.raises(config.ConfigError, match="exists"):
        config.write_key(str(p))
    os.chmod(p, 0o640)
    with pytest.raises(config.ConfigError, match="group or others"):
        config.read_key(str(p))
    os.chmod(p, 0o604)
    with pytest.raises(config.ConfigError, match="group or others"):
        config.read_key(str(p))
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 31)
    os.chmod(short, 0o600)
    with pytest.raises(config.ConfigError, match="at least 32"):
        config.read_key(str(short))
    with pytest.raises(config.ConfigError, match="not found"):
        config.read_key(str(tmp_path / "nope"))
    # the environment names the key over the rack file
    os.chmod(p, 0o600)
    monkeypatch.setenv(config.KEY_ENV, str(p))
    assert config.rack_key(None) == k
