import os

import numpy as np

from elasticps.runtime.shm import Attachments, OwnedVector, sweep


def test_attach_reads_in_place_and_sweep_removes_only_orphans(tmp_path):
    vec = OwnedVector("grad", 10)
    vec.array[:] = np.arange(10, dtype=np.float32)
    view = Attachments().view(vec.ref(2, 5))
    assert view.tolist() == [2.0, 3.0, 4.0]
    vec.array[3] = 42.0  # a reader sees writes in place, no copy
    assert view[1] == 42.0
    assert not view.flags.writeable

    # A segment left by a dead creator (pid 2**22 + 1 does not exist here) is swept; a live one stays.
    orphan = tmp_path / f"eps-grad-{2**22 + 1}-abcdef"
    live = tmp_path / f"eps-param-{os.getpid()}-abcdef"
    other = tmp_path / "not-ours"
    for f in (orphan, live, other):
        f.write_bytes(b"x")
    assert sweep(str(tmp_path)) == 1
    assert not orphan.exists() and live.exists() and other.exists()
    vec.close()
    assert not os.path.exists(f"/dev/shm/{vec.name}")
