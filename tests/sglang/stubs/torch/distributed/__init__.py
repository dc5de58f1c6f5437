"""Import stub for torch.distributed: a single decode rank, no process group."""


def is_available():
    return False


def is_initialized():
    return False


class ProcessGroup:
    pass


class ReduceOp:
    MIN, MAX, SUM = "min", "max", "sum"
