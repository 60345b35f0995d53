"""Counter-based Gaussian noise: standard normals that are a fixed function of (seed, row id,
column), so a large random matrix is read row by row without being stored or drawn whole.

Two uses: GPNet's random frequencies Ω (D × F/2, regenerated from the model's seed), and the
posterior draws of weight-space weights, where a batch draws only the rows of the features it
touches — keyed by the feature's id, the draw of w_d is the same in every batch that touches d, so
a Monte Carlo prediction of a sentence does not depend on which sentences share its batch.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_UINT = tf.uint32


def mix32(x):
    """lowbias32 (C. Wellons' 32-bit integer hash): a bijection of uint32 with good avalanche."""
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, _UINT)))
        x = x * tf.constant(factor, _UINT)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(16, _UINT)))


def seed_word(seed):
    """One uint32 key of a seed: a Python int (taken mod 2³²), or a stateless seed tensor (int32 `[2]`,
    both words mixed in)."""
    if isinstance(seed, (int, np.integer)):
        return tf.constant(int(seed) % 2**32, _UINT)
    words = tf.bitcast(tf.cast(tf.convert_to_tensor(seed), tf.int32), _UINT)
    return mix32(words[0] + tf.constant(0x632BE5AB, _UINT)) + words[1]


def hashed_normal(ids, num_columns: int, seed=0, dtype=tf.float32):
    """Standard normals Ω[d, c] for the rows `ids [U]` (non-negative ints < 2³²) and columns c <
    `num_columns` → `[U, num_columns]`: the same value for the same (seed, d, c) on every call,
    independent across entries (up to the hash's quality). `seed`: a Python int or a stateless seed
    tensor (`seed_word`). Two 24-bit uniforms per entry from the hash of (seed, d, 2c) and
    (seed, d, 2c + 1), Box–Muller."""
    ids = tf.cast(tf.convert_to_tensor(ids), _UINT)
    row = mix32(mix32(ids) + mix32(seed_word(seed) + tf.constant(0x9E3779B9, _UINT)))
    counters = mix32(tf.cast(tf.range(2 * num_columns), _UINT) * tf.constant(0x85EBCA6B, _UINT))
    bits = mix32(tf.bitwise.bitwise_xor(row[:, None], counters))  # [U, 2C]
    uniform = (tf.cast(tf.bitwise.right_shift(bits, tf.constant(8, _UINT)), dtype) + 0.5) * (2.0**-24)  # (0, 1)
    u1, u2 = uniform[:, :num_columns], uniform[:, num_columns:]
    return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * np.pi * u2)
