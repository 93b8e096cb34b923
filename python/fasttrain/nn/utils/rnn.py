"""ft.nn.utils.rnn: batches of sequences of different lengths, as torch.nn.utils.rnn's pad_sequence (a compiled RNN
reads padded batches of one length; padding is masked out in the loss by ignore_index, or in attention by a key
padding mask)."""
from ... import creation


def pad_sequence(sequences, batch_first=False, padding_value=0.0, padding_side="right"):
    """The tensors of a list, (L_i, *) each of one trailing shape, padded with padding_value to the longest, in the
    first one's dtype: (L, B, *), or (B, L, *) with batch_first, the padding after each (padding_side="right") or
    before it ("left"), as torch.nn.utils.rnn.pad_sequence."""
    sequences = list(sequences)
    if not sequences:
        raise ValueError("pad_sequence: needs at least one sequence")
    if padding_side not in ("left", "right"):
        raise ValueError(f"pad_sequence: padding_side must be 'left' or 'right', got {padding_side!r}")
    rest, dtype = tuple(sequences[0].shape[1:]), sequences[0].dtype
    for i, s in enumerate(sequences):
        if s.ndim < 1 or tuple(s.shape[1:]) != rest:
            raise ValueError(f"pad_sequence: sequence {i} has shape {tuple(s.shape)}: each must be (L_i, *rest) of "
                             f"the first's rest {rest}")
    longest = max(s.shape[0] for s in sequences)
    out = creation.full((len(sequences), longest, *rest), padding_value, dtype=dtype, device=sequences[0].device)
    for i, s in enumerate(sequences):
        n = s.shape[0]
        if n:
            out[i, slice(longest - n, longest) if padding_side == "left" else slice(0, n)] = s
    return out if batch_first else out.transpose(0, 1).contiguous()


def __getattr__(name):
    from ..graph import missing
    raise missing(__name__, name)
