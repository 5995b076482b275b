"""Per-request predictive distributions of output length: log-t, one (mu, sigma) per request.

A request's output length is modelled as ``X = exp(mu + sigma * T)``, ``T`` Student t with ``nu``
degrees of freedom (the log-t of the TIE paper, arXiv 2604.00499), on the continuous length scale.
Token counts are integers >= 1 (a request generates at least one token, as kvlab's traces and
workload profiles have it): the count ``K`` is ``X`` rounded to the nearest integer and at least
1, so ``P(K = k) = P(k - 0.5 <= X < k + 0.5)`` for ``k >= 2`` and ``P(K = 1) = P(X < 1.5)``,
the same interval model the fits use. The server stops
at ``max_new_tokens``, so what it generates is ``C = min(K, max_new_tokens)``.

A log-t length has no finite mean (``E[exp(sigma T)]`` diverges for every ``nu``), so every
expectation here is of the capped length ``C`` and needs ``max_new_tokens``.

Everything is vectorised over requests with NumPy and :mod:`kvlab.lengths.logt` on the host: the
predictor runs once per request before admission, not in the simulator's per-step loop. Move
results to the device with :func:`kvlab.backend.asarray` where a GPU simulator needs them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _validate as v
from ..lengths import logt
from .._intmath import quantile_tokens, round_tokens

#: Composite Gauss-Legendre rule for the capped partial moment: panels x nodes per panel.
_GL_PANELS = 32
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(16)
#: Token counts below which the capped mean is summed exactly rather than integrated.
_EXACT_TOKENS = 32
#: Rows per chunk of the (requests x nodes) quadrature arrays, to bound memory.
_CHUNK_ROWS = 4096
#: Largest token count ``ppf`` returns (int64 headroom).
_MAX_TOKENS = 2.0**62


@dataclass(frozen=True, kw_only=True, eq=False)
class LogTPredictive:
    """Predicted output-length distributions of ``n`` requests: ``exp(mu_i + sigma_i T_nu)``.

    Parameters
    ----------
    mu : array_like of float, shape (n,)
        Location of log length per request (log tokens); ``exp(mu)`` is the median length.
    sigma : array_like of float, shape (n,) or scalar
        Scale of log length per request (log tokens), > 0; a scalar applies to every request.
    nu : float
        Degrees of freedom of the Student t on log length, shared by all requests, > 0.

    Notes
    -----
    The arguments are checked and stored as read-only float64 arrays of shape (n,). Index with
    an int, slice, integer array or boolean mask to get those requests' predictive.

    Examples
    --------
    >>> p = LogTPredictive(mu=np.log([20.0, 200.0]), sigma=0.5, nu=3.5)
    >>> p.ppf(0.5).tolist()
    [20, 200]
    >>> len(p[[1]])
    1
    """

    mu: np.ndarray
    sigma: np.ndarray
    nu: float

    def __post_init__(self) -> None:
        mu = np.atleast_1d(np.asarray(self.mu, dtype=np.float64))
        if mu.ndim != 1 or mu.size == 0:
            raise ValueError(f"mu must be a non-empty 1-D array of log tokens, got shape {mu.shape}")
        sigma = np.atleast_1d(np.asarray(self.sigma, dtype=np.float64))
        try:
            sigma = np.broadcast_to(sigma, mu.shape)
        except ValueError:
            raise ValueError(f"sigma has shape {sigma.shape}, expected a scalar or {mu.shape} "
                             f"like mu") from None
        bad = np.flatnonzero(~np.isfinite(mu))
        if bad.size:
            raise ValueError(f"mu must be finite; request {bad[0]} has mu={mu[bad[0]]!r}")
        bad = np.flatnonzero(~np.isfinite(sigma) | (sigma <= 0))
        if bad.size:
            raise ValueError(f"sigma must be finite and > 0; request {bad[0]} has "
                             f"sigma={sigma[bad[0]]!r}")
        mu, sigma = mu.copy(), sigma.copy()
        mu.flags.writeable = False
        sigma.flags.writeable = False
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "sigma", sigma)
        object.__setattr__(self, "nu", v.positive_float(self.nu, "nu"))

    def __len__(self) -> int:
        return int(self.mu.shape[0])

    def __getitem__(self, index: Any) -> LogTPredictive:
        mu = np.atleast_1d(self.mu[index])
        if mu.size == 0:
            raise ValueError(f"index {index!r} selects no requests out of {len(self)}")
        return LogTPredictive(mu=mu, sigma=np.atleast_1d(self.sigma[index]), nu=self.nu)

    def cdf(self, tokens: Any) -> np.ndarray:
        """``P(K <= tokens)`` per request for integer counts ``tokens`` (scalar or shape (n,)).

        Returns
        -------
        ndarray of float64, shape (n,)
            ``F((log(tokens + 0.5) - mu) / sigma)``, ``F`` the Student t cdf; 0 for ``tokens = 0``.
        """
        k = v.nonnegative_int_array(tokens, "tokens")
        if k.size not in (1, len(self)):
            raise ValueError(f"tokens must be a scalar or hold one count per request ({len(self)}), "
                             f"got {k.size}")
        return np.where(k >= 1, logt.cdf(k + 0.5, self.mu, self.sigma, self.nu), 0.0)

    def ppf(self, q: float) -> np.ndarray:
        """Per-request ``q``-quantile of the output length in tokens (what to reserve for ``q``).

        The smallest integer ``k >= 1`` with ``P(K <= k) >= q``:
        ``max(ceil(exp(mu + sigma t_q) - 0.5), 1)``.

        Parameters
        ----------
        q : float
            Probability in (0, 1).

        Returns
        -------
        ndarray of int64, shape (n,)
            Tokens per request.
        """
        q = v.fraction(q, "q", high_closed=False)
        x = logt.ppf(q, self.mu, self.sigma, self.nu)
        if np.any(x > _MAX_TOKENS):
            raise ValueError(f"q={q} puts some requests' quantile beyond 2**62 tokens "
                             f"(heavy log-t tail); use a smaller q")
        return quantile_tokens(x)

    def sample(self, rng: np.random.Generator) -> np.ndarray:
        """One draw of the uncapped output length per request, in tokens >= 1 (int64, shape (n,))."""
        x = np.minimum(logt.draw(rng, self.mu, self.sigma, self.nu, len(self)), _MAX_TOKENS)
        return round_tokens(x)

    def mean(self, max_new_tokens: int | None = None) -> np.ndarray:
        """Expected generated length ``E[min(K, max_new_tokens)]`` per request (tokens).

        Parameters
        ----------
        max_new_tokens : int
            The cap the server generates under (tokens). Required: the uncapped log-t mean is
            infinite.

        Returns
        -------
        ndarray of float64, shape (n,)
        """
        cap = self._cap(max_new_tokens)
        return self._capped_mean(np.full(len(self), float(cap)))

    def cvar(self, q: float, max_new_tokens: int) -> np.ndarray:
        """Conditional value at risk ``CVaR_q[min(K, max_new_tokens)]`` per request (tokens).

        The mean of the worst ``1 - q`` share of outcomes, ``(1/(1-q)) * int_q^1 ppf(u) du``,
        computed as ``VaR_q + E[(C - VaR_q)^+] / (1 - q)`` (Rockafellar-Uryasev, exact for the
        integer-valued ``C``), with ``VaR_q = min(ppf(q), max_new_tokens)``.
        """
        return self._mean_and_cvar(q, max_new_tokens)[1]

    def tail_inflated_expectation(self, beta: float, max_new_tokens: int) -> np.ndarray:
        """TIE score ``E[C] + beta * CVaR_0.9[C]``, ``C = min(K, max_new_tokens)`` (tokens).

        The Tail Inflated Expectation of arXiv 2604.00499: the length "truncated at
        max_new_tokens" is read as capped (mass beyond the cap sits at the cap), because that
        is what the server generates; conditioning on ``K <= max_new_tokens`` instead would
        drop exactly the long requests the tail term is meant to flag.

        Parameters
        ----------
        beta : float
            Weight of the tail term, >= 0 (0 gives the capped mean).
        max_new_tokens : int
            The generation cap (tokens).

        Returns
        -------
        ndarray of float64, shape (n,)
        """
        beta = v.nonnegative_float(beta, "beta")
        mean, cvar = self._mean_and_cvar(0.9, max_new_tokens)
        return mean + beta * cvar

    def _mean_and_cvar(self, q: float, max_new_tokens: int) -> tuple[np.ndarray, np.ndarray]:
        q = v.fraction(q, "q", high_closed=False)
        cap = float(self._cap(max_new_tokens))
        n = len(self)
        var_tokens = np.minimum(self.ppf(q).astype(np.float64), cap)
        both = self._capped_mean(np.concatenate([np.full(n, cap), var_tokens]))
        mean, excess = both[:n], np.maximum(both[:n] - both[n:], 0.0)
        # CVaR <= cap; the clip only absorbs quadrature error amplified by 1 / (1 - q)
        return mean, np.minimum(var_tokens + excess / (1.0 - q), cap)

    @staticmethod
    def _cap(max_new_tokens: int | None) -> int:
        if max_new_tokens is None:
            raise ValueError("max_new_tokens is required: a log-t length has no finite mean, so "
                             "expectations are of the length capped at max_new_tokens")
        return v.positive_int(max_new_tokens, "max_new_tokens")

    def _capped_mean(self, caps: np.ndarray) -> np.ndarray:
        """``E[min(K, c)] = sum_{k<c} P(K > k)`` for per-row caps ``c`` (rows tile requests).

        ``P(K > 0) = 1`` and ``P(K > k) = P(X >= k + 0.5)`` for ``k >= 1``.

        The first ``_EXACT_TOKENS`` terms are summed exactly (where a narrow distribution sits on
        a few integers). Beyond, the sum is the midpoint rule for ``int_a^c P(X > x) dx``, ``a =
        _EXACT_TOKENS``, which differs from it by about ``f(a) / 24`` tokens (``f`` the length
        density: under 0.005 tokens for ``sigma >= 0.05``). By parts, that integral is
        ``c S(c) - a S(a) + exp(mu) int_{z_a}^{z_c} e^{sigma t} f_T(t) dt`` with ``z_x = (log x -
        mu) / sigma``; the partial moment of the t has no closed form: composite Gauss-Legendre
        in ``t`` (hand-written because scipy's quad is scalar and this runs for every request at
        once).
        """
        n = len(self)
        reps = caps.size // n
        mu, sigma = np.tile(self.mu, reps), np.tile(self.sigma, reps)
        nu = self.nu
        half_steps = np.arange(_EXACT_TOKENS) + 0.5
        out = np.zeros(caps.size)
        for start in range(0, caps.size, _CHUNK_ROWS):
            rows = slice(start, min(start + _CHUNK_ROWS, caps.size))
            m, s, c = mu[rows], sigma[rows], caps[rows]
            survival = logt.sf(half_steps[None, :], m[:, None], s[:, None], nu)
            survival[:, 0] = 1.0   # K >= 1
            exact = np.where(half_steps[None, :] < c[:, None], survival, 0.0).sum(axis=1)
            far = c > _EXACT_TOKENS
            if np.any(far):
                m, s, c = m[far], s[far], c[far]
                z_a = logt.standardize(_EXACT_TOKENS, m, s)
                z_c = logt.standardize(c, m, s)
                width = (z_c - z_a) / _GL_PANELS
                # nodes: rows x panels x nodes, mapped from [-1, 1] into each panel
                left = z_a[:, None] + width[:, None] * np.arange(_GL_PANELS)[None, :]
                z = left[:, :, None] + (0.5 * width)[:, None, None] * (_GL_NODES + 1.0)[None, None, :]
                log_f = logt.t_logpdf(z, nu)
                moment = (np.exp(log_f + s[:, None, None] * z + m[:, None, None]) * _GL_WEIGHTS
                          ).sum(axis=(1, 2)) * 0.5 * width
                exact[far] += (moment + c * logt.sf(c, m, s, nu)
                               - _EXACT_TOKENS * logt.sf(_EXACT_TOKENS, m, s, nu))
            out[rows] = exact
        return np.clip(out, 0.0, caps)   # the quadrature may stray by ~1e-3 tokens past 0 or the cap
