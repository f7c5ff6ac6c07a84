"""The stage-release check of tests/kernels/staged_release.py on a hand-written warp-specialized
loop in TileLang's CUDA form: it finds the rows written with plain stores behind a TMA copy's
release, and fails when the consumer releases the stage before it reads them."""

import pytest

from tests.kernels.staged_release import assert_stages_released_after_last_read, early_releases


def pipeline(consumer_body: str) -> str:
    """A producer that waits for stage (step & 1) to be released, refills it by TMA (Q_s) and with
    plain stores (lse_s), and a consumer running ``consumer_body`` in its loop."""
    return """
  if (128 <= ((int)threadIdx.x)) {
    for (int step = 0; step < n; ++step) {
      mbarrier[((step & 1) + 2)].wait((((step & 3) >> 1) ^ 1));
      tl::tma_load(Q_desc, mbarrier[(step & 1)], (&(((bfloat16_t*)Q_s)[((step & 1) * 4096)])), 0, step);
      ((float*)lse_s)[(((step & 1) * 64) + ((int)threadIdx.x))] = LSE[step];
    }
  } else {
    for (int step_1 = 0; step_1 < n; ++step_1) {
      mbarrier[(step_1 & 1)].wait(((step_1 & 3) >> 1));
""" + consumer_body + """
    }
    out[0] = ((float*)lse_s)[0];
  }
"""


GEMM = "      tl::initialize_wgmma_descriptor<1, 1, 64>(desc_b, (&(((bfloat16_t*)Q_s)[0])));\n"
READ_LSE = "      p[0] = exp2f(s[0] - ((float*)lse_s)[((step_1 & 1) * 64)]);\n"
RELEASE = "      mbarrier[((step_1 & 1) + 2)].arrive();\n"


def test_release_after_last_read_passes():
    assert_stages_released_after_last_read(pipeline(GEMM + READ_LSE + RELEASE), {"Q_s", "lse_s"})


def test_release_before_plain_rows_are_read_fails():
    """The old d 256 dV kernel: released after the last use of Q_s, before reading lse_s (the read
    after the loop does not count: the producer has no later stage to write)."""
    cuda = pipeline(GEMM + RELEASE + READ_LSE)
    staged, problems = early_releases(cuda)
    assert staged == {"Q_s", "lse_s"}
    assert len(problems) == 1 and problems[0].startswith("lse_s: mbarrier[((step&1)+2)] released at")
    with pytest.raises(AssertionError, match="lse_s"):
        assert_stages_released_after_last_read(cuda, {"lse_s"})


def test_buffer_the_check_does_not_see_fails():
    with pytest.raises(AssertionError, match="expected"):
        assert_stages_released_after_last_read(pipeline(GEMM + READ_LSE + RELEASE), {"dO_s"})
