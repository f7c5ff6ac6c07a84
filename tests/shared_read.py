"""The one-scalar shared-memory read the bounds tests share (hostgen, passes): ``threads``
threads copy a 256-element tensor into shared memory, then thread ``tx`` reads element
``index(tx, off)`` of it, so whether the read stays in bounds depends on the scalar ``off``
alone. The verifier derives preconditions on ``off``; the launcher checks them."""

import tilelang.language as T


def shared_read(index, threads=32, scalar=T.int32):
    """``index(tx, off)``: the element of the shared copy that thread ``tx`` reads, as TIR."""

    @T.prim_func
    def main(A: T.Tensor((256,), "float32"), B: T.Tensor((threads,), "float32"), off: scalar):
        with T.Kernel(1, threads=threads):
            S = T.alloc_shared((256,), "float32")
            tx = T.get_thread_binding()
            for i in T.Parallel(256):
                S[i] = A[i]
            B[tx] = S[index(tx, off)]

    return main


def offset_read(threads=32):
    """A window of ``threads`` elements at offset ``off``: in bounds for ``0 <= off <= 256 - threads``."""
    return shared_read(lambda tx, off: tx + off, threads)
