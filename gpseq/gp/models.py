"""Sparse GP models: the stochastic variational GP (SVGP), the collapsed SGPR bound and FITC.

SVGP (design notes `gps-for-big-data-svi.md`, `vi-for-gps-lectures.md`): minibatch ELBO
    L = N / |batch| · Σ_{n ∈ batch} Σ_k π_k E_{q_k(f_n)}[log p(y_n | f_n)] − KL(q(u) ‖ p(u))
with q(u) a `VariationalGaussian` (mixture when K > 1, graybox-structured-gp eq. 13). SGPR: Titsias'
collapsed bound log N(y | 0, Q_ff + σ² I) − tr(K_ff − Q_ff) / (2σ²).
FITC: log N(y | 0, Q_ff + diag(K_ff − Q_ff) + σ² I).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from gpseq.features.padded import PaddedRows
from gpseq.gp.conditionals import mixture_marginals_from_projections, projections_from_kzx
from gpseq.gp.likelihoods import Gaussian
from gpseq.gp.linalg import safe_cholesky, whitened_solve
from gpseq.gp.variational import VariationalGaussian


class SVGP(tf.Module):
    """Stochastic variational GP with P latent functions sharing inducing inputs `Z [M, D]`."""

    def __init__(
        self,
        kernel,
        likelihood,
        inducing_inputs,
        num_latent: int = 1,
        *,
        num_data: int | None = None,
        whiten: bool = True,
        full_cov: bool = True,
        num_components: int = 1,
        train_inducing: bool = False,
        jitter: float = 1e-6,
        dtype=tf.float64,
        seed: int = 0,
        name: str = "svgp",
    ):
        super().__init__(name=name)
        self.kernel, self.likelihood = kernel, likelihood
        self.num_data, self.jitter, self.dtype, self.whiten = num_data, jitter, dtype, whiten
        Z = np.asarray(inducing_inputs, dtype=np.float64)
        self.inducing_inputs = tf.Variable(tf.constant(Z, dtype), name="inducing_inputs", trainable=train_inducing)
        self.q = VariationalGaussian(Z.shape[0], num_latent, full_cov=full_cov, whiten=whiten,
                                     num_components=num_components, dtype=dtype, seed=seed)

    def kzz_cholesky(self):
        """chol(K_zz + jitter I) `[M, M]`."""
        return safe_cholesky(self.kernel.K(self.inducing_inputs), jitter=self.jitter)

    def predict_f_components(self, X):
        """Marginals of q(f) per mixture component at `X [N, D]` (or padded rows) → (`[K, N, P]`, `[K, N, P]`)."""
        return self._marginals(X, self.q.parameters())[:2]

    def _marginals(self, X, parameters):
        """(mean, var) `[K, N, P]` each and chol(K_zz) (None whitened: the solve L⁻¹ K_zx is then one op
        with its own gradient, `whitened_solve`, and nothing else needs L)."""
        Z = self.inducing_inputs
        # K_zx in the layout of the solves (padded sparse rows are a kernel's first argument only)
        Kzx = tf.linalg.matrix_transpose(self.kernel.K(X, Z)) if isinstance(X, PaddedRows) else self.kernel.K(Z, X)
        if self.whiten:
            Kzz_cholesky = None
            a_w_t = proj_t = whitened_solve(self.kernel.K(Z), Kzx, jitter=self.jitter)
        else:
            Kzz_cholesky = self.kzz_cholesky()
            a_w_t, proj_t = projections_from_kzx(Kzx, Kzz_cholesky, whiten=False)
        mean, var = mixture_marginals_from_projections(a_w_t, proj_t, self.kernel.K_diag(X), *parameters)
        return mean, var, Kzz_cholesky

    def elbo(self, batch):
        """Minibatch ELBO: `batch = (X [B, D], Y [B, ...])`, likelihood term rescaled by N / B → scalar."""
        X, Y = batch
        parameters = self.q.parameters()  # once: the marginals and the KL share them (and chol(K_zz))
        mean, var, Kzz_cholesky = self._marginals(X, parameters)  # [K, B, P]
        expectations = self.likelihood.variational_expectations
        if self.q.num_components == 1:  # π = (1,): skips the softmax and the products by 1
            var_exp = tf.reduce_sum(expectations(tf.squeeze(mean, 0), tf.squeeze(var, 0), Y))
        else:
            pi = self.q.mixture_weights()
            var_exp = tf.add_n([pi[k] * tf.reduce_sum(expectations(mean[k], var[k], Y))
                                for k in range(self.q.num_components)])
        if self.num_data is None:
            scale = tf.ones([], self.dtype)
        else:
            scale = tf.cast(self.num_data, self.dtype) / tf.cast(tf.shape(mean)[1], self.dtype)
        kl = self.q.kl(Kzz_cholesky, parameters)
        return var_exp * scale - kl

    def loss(self, batch, seed=None):
        """−ELBO (what `gpseq.training.Trainer` minimises; closed form, so `seed` is unused)."""
        return -self.elbo(batch)

    def variational_parameters(self):
        """q(u)'s (q_mu, q_sqrt), which the trainer may step by natural gradients instead of Adam."""
        return [(self.q.q_mu, self.q.q_sqrt)]

    def predict_f(self, X):
        """Mean and variance of q(f) at `X` → (`[N, P]`, `[N, P]`) (moment-matched over components)."""
        mean, var = self.predict_f_components(X)
        pi = self.q.mixture_weights()[:, None, None]
        f_mean = tf.reduce_sum(pi * mean, 0)
        return f_mean, tf.reduce_sum(pi * (var + mean**2), 0) - f_mean**2

    def predict_y(self, X):
        """Predictive mean and variance of y at `X` (from the moment-matched q(f))."""
        return self.likelihood.predict_y(*self.predict_f(X))

    def predict_log_density(self, batch):
        """log p(y* | X*) per point `[N]` (mixture: log Σ_k π_k p_k)."""
        X, Y = batch
        mean, var = self.predict_f_components(X)
        logs = tf.stack([self.likelihood.predict_log_density(mean[k], var[k], Y) for k in range(self.q.num_components)])
        return tf.reduce_logsumexp(tf.math.log(self.q.mixture_weights())[:, None] + logs, 0)


class _CollapsedBase(tf.Module):
    """Shared pieces of SGPR and FITC: full data `(X [N, D], Y [N, P])`, Gaussian noise, fixed Z."""

    def __init__(self, kernel, data, inducing_inputs, noise_variance=1.0, *, jitter=1e-6, train_inducing=False,
                 dtype=tf.float64, name=None):
        super().__init__(name=name)
        X, Y = data
        self.X = X if not isinstance(X, np.ndarray) else tf.constant(X, dtype)
        self.Y = tf.constant(np.asarray(Y, dtype=np.float64).reshape(len(Y), -1), dtype)
        self.kernel, self.jitter, self.dtype = kernel, jitter, dtype
        self.likelihood = Gaussian(noise_variance, dtype)
        Z = np.asarray(inducing_inputs, dtype=np.float64)
        self.inducing_inputs = tf.Variable(tf.constant(Z, dtype), name="inducing_inputs", trainable=train_inducing)

    def _common(self):
        L = safe_cholesky(self.kernel.K(self.inducing_inputs), jitter=self.jitter)  # [M, M]
        V = tf.linalg.triangular_solve(L, self.kernel.K(self.inducing_inputs, self.X), lower=True)  # L⁻¹K_uf [M, N]
        return L, V

    def loss(self, batch=None, seed=None):
        """−(the collapsed bound) on the model's full data (`batch`, `seed` unused)."""
        return -self.elbo()


class SGPR(_CollapsedBase):
    """Titsias' collapsed variational bound for Gaussian regression (q(u) optimal, analytically)."""

    def __init__(self, kernel, data, inducing_inputs, noise_variance=1.0, **kwargs):
        super().__init__(kernel, data, inducing_inputs, noise_variance, name="sgpr", **kwargs)

    def _posterior_terms(self):
        L, V = self._common()
        noise = tf.convert_to_tensor(self.likelihood.variance)
        A = V / tf.sqrt(noise)  # [M, N]
        B = tf.eye(tf.shape(A)[0], dtype=self.dtype) + tf.linalg.matmul(A, A, transpose_b=True)
        LB = tf.linalg.cholesky(B)
        c = tf.linalg.triangular_solve(LB, tf.linalg.matmul(A, self.Y), lower=True) / tf.sqrt(noise)  # [M, P]
        return L, A, LB, c, noise

    def elbo(self):
        """log N(y | 0, Q_ff + σ² I) − tr(K_ff − Q_ff) / (2σ²), summed over the P outputs → scalar."""
        L, A, LB, c, noise = self._posterior_terms()
        N = tf.cast(tf.shape(self.Y)[0], self.dtype)
        P = tf.cast(tf.shape(self.Y)[1], self.dtype)
        log_det = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LB))) + N * tf.math.log(noise)
        quad = tf.reduce_sum(self.Y**2) / noise - tf.reduce_sum(c**2)
        trace = tf.reduce_sum(self.kernel.K_diag(self.X)) / noise - tf.reduce_sum(A**2)
        return -0.5 * P * (N * np.log(2 * np.pi) + log_det) - 0.5 * quad - 0.5 * P * trace

    def predict_f(self, Xnew):
        """Posterior mean and variance of f at `Xnew` → (`[N*, P]`, `[N*, P]`)."""
        L, A, LB, c, noise = self._posterior_terms()
        tmp1 = tf.linalg.triangular_solve(L, self.kernel.K(self.inducing_inputs, Xnew), lower=True)  # [M, N*]
        tmp2 = tf.linalg.triangular_solve(LB, tmp1, lower=True)
        mean = tf.linalg.matmul(tmp2, c, transpose_a=True)
        var = self.kernel.K_diag(Xnew) + tf.reduce_sum(tmp2**2, 0) - tf.reduce_sum(tmp1**2, 0)
        return mean, tf.tile(var[:, None], [1, tf.shape(self.Y)[1]])


class FITC(_CollapsedBase):
    """The FITC approximate marginal likelihood log N(y | 0, Q_ff + diag(K_ff − Q_ff) + σ² I)."""

    def __init__(self, kernel, data, inducing_inputs, noise_variance=1.0, **kwargs):
        super().__init__(kernel, data, inducing_inputs, noise_variance, name="fitc", **kwargs)

    def _terms(self):
        L, V = self._common()
        noise = tf.convert_to_tensor(self.likelihood.variance)
        nu = self.kernel.K_diag(self.X) - tf.reduce_sum(V**2, 0) + noise  # [N]
        B = tf.eye(tf.shape(V)[0], dtype=self.dtype) + tf.linalg.matmul(V / nu, V, transpose_b=True)
        LB = tf.linalg.cholesky(B)
        gamma = tf.linalg.triangular_solve(LB, tf.linalg.matmul(V, self.Y / nu[:, None]), lower=True)  # [M, P]
        return L, V, nu, LB, gamma

    def elbo(self):
        """The FITC log marginal likelihood (Woodbury form, O(N M²)) → scalar (named elbo like the others)."""
        _, _, nu, LB, gamma = self._terms()
        N = tf.cast(tf.shape(self.Y)[0], self.dtype)
        P = tf.cast(tf.shape(self.Y)[1], self.dtype)
        log_det = tf.reduce_sum(tf.math.log(nu)) + 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LB)))
        quad = tf.reduce_sum(self.Y**2 / nu[:, None]) - tf.reduce_sum(gamma**2)
        return -0.5 * P * (N * np.log(2 * np.pi) + log_det) - 0.5 * quad

    def predict_f(self, Xnew):
        """FITC predictive mean and variance of f at `Xnew` → (`[N*, P]`, `[N*, P]`)."""
        L, _, _, LB, gamma = self._terms()
        w = tf.linalg.triangular_solve(L, self.kernel.K(self.inducing_inputs, Xnew), lower=True)  # [M, N*]
        tmp = tf.linalg.triangular_solve(LB, w, lower=True)  # [M, N*]
        mean = tf.linalg.matmul(tmp, gamma, transpose_a=True)
        var = self.kernel.K_diag(Xnew) - tf.reduce_sum(w**2, 0) + tf.reduce_sum(tmp**2, 0)
        return mean, tf.tile(var[:, None], [1, tf.shape(self.Y)[1]])

