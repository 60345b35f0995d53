"""gpseq must work where `tf-keras` is not installed (it is not a gpseq dependency): TFP 0.25 is
loaded through `gpseq._tfp`, which lends it a placeholder only while it loads."""

import subprocess
import sys
import textwrap


def test_model_trains_and_tf_keras_stays_unimportable_without_tf_keras():
    code = textwrap.dedent(
        """
        import importlib.abc, sys

        class Block(importlib.abc.MetaPathFinder):  # make tf_keras unimportable, as after `pip install gpseq`
            def find_spec(self, name, path=None, target=None):
                if name == "tf_keras" or name.startswith("tf_keras."):
                    raise ImportError("tf_keras blocked for this test")
                return None

        sys.meta_path.insert(0, Block())
        import numpy as np
        import tensorflow as tf
        from gpseq.corpora import read_conll
        from gpseq.features import get_preset
        from gpseq.structured.model import ModelConfig
        from gpseq.tagger import Tagger, TaggerConfig
        from gpseq.training.trainer import TrainingConfig

        train = read_conll("corpora/sample/train.conll")[:40]
        config = TaggerConfig(features=get_preset("pos"), model=ModelConfig(kernel="linear+rbf", num_inducing=4),
                              training=TrainingConfig(epochs=1, batch_size=20, seed=0))
        tagger = Tagger.train(train, config)
        result = tagger.tag(train[:2])[0]
        assert np.allclose(result.probabilities.sum(-1), 1.0, atol=1e-5)
        assert "tf_keras" not in sys.modules
        try:
            import tf_keras
        except ImportError:
            print("OK")
        """
    )
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("OK")
