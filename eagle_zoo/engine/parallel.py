"""Tensor-parallel start-up checks (the TP runtime is tracked in issue 9)."""


def check_tensor_parallel(tensor_parallel_size: int) -> None:
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    raise NotImplementedError(
        f"tensor_parallel_size={tensor_parallel_size}: tensor parallelism is not available in this build; "
        "use tensor_parallel_size=1"
    )
