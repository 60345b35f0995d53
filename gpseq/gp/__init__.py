"""The shared sparse-GP core: kernels (dense and padded sparse inputs), the weight-space linear GP,
K-means inducing inputs, variational q(u) (mixtures), conditionals (graybox-structured-gp eqs.
15–18), likelihoods, SVGP / SGPR / FITC, natural gradients, deep GPs and GPNet (inference networks).
Train them with `gpseq.training.trainer.Trainer`."""

from gpseq.gp.conditionals import (
    conditional_blocks, conditional_marginals, marginals_from_kzx, mixture_blocks, mixture_marginals,
)
from gpseq.gp.inducing import kmeans_inducing
from gpseq.gp.kernels import RBF, Linear, Matern32, Matern52, Product, Sum
from gpseq.gp.likelihoods import Bernoulli, Gaussian, Softmax
from gpseq.gp.linalg import safe_cholesky
from gpseq.gp.models import FITC, SGPR, SVGP
from gpseq.gp.natgrad import NaturalGradient
from gpseq.gp.variational import VariationalGaussian
from gpseq.gp.weight_space import WeightSpaceLinear

__all__ = [
    "Bernoulli", "FITC", "Gaussian", "Linear", "Matern32", "Matern52", "NaturalGradient", "Product", "RBF",
    "SGPR", "SVGP", "Softmax", "Sum", "VariationalGaussian", "WeightSpaceLinear", "conditional_blocks",
    "conditional_marginals", "kmeans_inducing", "marginals_from_kzx", "mixture_blocks", "mixture_marginals", "safe_cholesky",
]

# GPNet: an inference network trained by stochastic functional mirror descent, and random features
from gpseq.gp.gpnet import GPNet  # noqa: E402
from gpseq.gp.gpnet_training import GPNetTrainer  # noqa: E402
from gpseq.gp.random_features import RandomFeatures  # noqa: E402

__all__ += ["GPNet", "GPNetTrainer", "RandomFeatures"]

# deep GPs (DSVI and the nested variational compression bound) and psi statistics
from gpseq.gp.deep import DeepGP, GPLayer, build_deep_gp  # noqa: E402
from gpseq.gp.nested import nested_elbo, nested_predict_f  # noqa: E402
from gpseq.gp.psi import psi_statistics  # noqa: E402

__all__ += ["DeepGP", "GPLayer", "build_deep_gp", "nested_elbo", "nested_predict_f", "psi_statistics"]
