//! Signals: a value as a pure function of simulated time (seconds since the first successful
//! init). A signal is one *shape* (constant, ramp, sine, steps) plus optional seeded gaussian
//! noise and optional clamps. Shapes also integrate in closed form, which is how energy stays
//! consistent with power without keeping any state between calls.
//!
//! In a scenario a signal is either a bare number (a constant) or an inline table:
//!
//! ```toml
//! gpu_util = 85                                          # constant
//! gpu_util = { value = 85, stddev = 3 }                  # constant plus noise
//! power_w  = { from = 80, to = 650, over = 120, start = 10 }   # ramp
//! temperature_c = { mean = 60, amplitude = 8, period = 300 }   # sine
//! gpu_util = { steps = [[0, 5], [30, 95], [600, 0]] }    # steps: [at_seconds, value]
//! gpu_util = { mean = 50, stddev = 10, seed = 7, every = 0.5 } # noise around a mean
//! ```

use std::f64::consts::TAU;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

/// A value over time: a shape, optional noise, optional clamps.
#[derive(Debug, Clone, PartialEq)]
pub struct Signal {
    shape: Shape,
    noise: Option<Noise>,
    min: Option<f64>,
    max: Option<f64>,
}

/// The deterministic part of a signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// The same value at every time.
    Constant(f64),
    /// `from` until `start`, then linear to `to` over `over` seconds, then `to`.
    Ramp {
        from: f64,
        to: f64,
        start: f64,
        over: f64,
    },
    /// `mean + amplitude * sin(2π t / period + phase)`.
    Sine {
        mean: f64,
        amplitude: f64,
        period: f64,
        phase: f64,
    },
    /// Piecewise constant: the value of the last step at or before `t` (the first step's value
    /// before it). `prefix[i]` is the integral from 0 to `times[i]`, so integrating is a binary
    /// search rather than a walk.
    Steps {
        times: Box<[f64]>,
        values: Box<[f64]>,
        prefix: Box<[f64]>,
    },
}

/// Gaussian noise, piecewise constant over buckets of `every` seconds, derived from a hash of
/// (seed, bucket) so that the same time always yields the same value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    pub stddev: f64,
    pub seed: u64,
    pub every: f64,
}

impl Signal {
    /// A constant signal.
    pub const fn constant(value: f64) -> Self {
        Signal {
            shape: Shape::Constant(value),
            noise: None,
            min: None,
            max: None,
        }
    }

    /// Builds a signal from parts; `validate` is applied by the scenario parser.
    pub fn new(shape: Shape, noise: Option<Noise>, min: Option<f64>, max: Option<f64>) -> Self {
        Signal {
            shape,
            noise,
            min,
            max,
        }
    }

    /// The shape (the noise-free part).
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The same signal with its noise re-seeded by `salt`, so that the copies a `count`
    /// template makes do not all move in lock step.
    pub fn salted(&self, salt: u64) -> Signal {
        let mut s = self.clone();
        if let Some(n) = s.noise.as_mut() {
            n.seed = splitmix64(n.seed ^ splitmix64(salt));
        }
        s
    }

    /// The value at time `t` (seconds).
    #[inline]
    pub fn value(&self, t: f64) -> f64 {
        let mut v = self.shape.value(t);
        if let Some(n) = &self.noise {
            v += n.sample(t);
        }
        if let Some(lo) = self.min {
            v = v.max(lo);
        }
        if let Some(hi) = self.max {
            v = v.min(hi);
        }
        v
    }

    /// The integral of the shape from 0 to `t`. Noise (mean zero) and clamps are left out so
    /// the result is smooth and, for a non-negative shape, monotonic.
    #[inline]
    pub fn integral(&self, t: f64) -> f64 {
        self.shape.integral(t)
    }

    /// The smallest value the shape can take (noise and clamps aside).
    pub fn shape_min(&self) -> f64 {
        self.shape.min()
    }
}

impl Shape {
    #[inline]
    fn value(&self, t: f64) -> f64 {
        match *self {
            Shape::Constant(v) => v,
            Shape::Ramp {
                from,
                to,
                start,
                over,
            } => {
                if t <= start {
                    from
                } else if t >= start + over {
                    to
                } else {
                    from + (to - from) * (t - start) / over
                }
            }
            Shape::Sine {
                mean,
                amplitude,
                period,
                phase,
            } => mean + amplitude * (TAU * t / period + phase).sin(),
            Shape::Steps {
                ref times,
                ref values,
                ..
            } => {
                let i = times.partition_point(|&at| at <= t);
                values[i.saturating_sub(1)]
            }
        }
    }

    fn integral(&self, t: f64) -> f64 {
        if t <= 0.0 {
            return 0.0;
        }
        match *self {
            Shape::Constant(v) => v * t,
            Shape::Ramp {
                from,
                to,
                start,
                over,
            } => {
                let flat_before = t.min(start.max(0.0));
                let mut acc = from * flat_before;
                if t > start {
                    // Portion of the slope inside [max(start,0), min(t, start+over)].
                    let a = start.max(0.0);
                    let b = t.min(start + over);
                    if b > a {
                        let va = from + (to - from) * (a - start) / over;
                        let vb = from + (to - from) * (b - start) / over;
                        acc += (va + vb) * 0.5 * (b - a);
                    }
                    if t > start + over {
                        acc += to * (t - (start + over).max(0.0));
                    }
                }
                acc
            }
            Shape::Sine {
                mean,
                amplitude,
                period,
                phase,
            } => {
                mean * t
                    + amplitude * period / TAU * (phase.cos() - (TAU * t / period + phase).cos())
            }
            Shape::Steps {
                ref times,
                ref values,
                ref prefix,
            } => {
                let i = times.partition_point(|&at| at <= t);
                if i == 0 {
                    values[0] * t
                } else {
                    prefix[i - 1] + values[i - 1] * (t - times[i - 1].max(0.0))
                }
            }
        }
    }

    fn min(&self) -> f64 {
        match self {
            Shape::Constant(v) => *v,
            Shape::Ramp { from, to, .. } => from.min(*to),
            Shape::Sine {
                mean, amplitude, ..
            } => mean - amplitude.abs(),
            Shape::Steps { values, .. } => values.iter().copied().fold(f64::INFINITY, f64::min),
        }
    }

    /// Steps from `(at, value)` pairs, sorted by time, with their prefix integrals.
    pub fn steps(mut pairs: Vec<(f64, f64)>) -> Shape {
        pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let times: Box<[f64]> = pairs.iter().map(|p| p.0).collect();
        let values: Box<[f64]> = pairs.iter().map(|p| p.1).collect();
        let mut prefix = Vec::with_capacity(times.len());
        // Before the first step the first value holds, from time 0.
        let mut acc = values[0] * times[0].max(0.0);
        prefix.push(acc);
        for i in 1..times.len() {
            acc += values[i - 1] * (times[i].max(0.0) - times[i - 1].max(0.0));
            prefix.push(acc);
        }
        Shape::Steps {
            times,
            values,
            prefix: prefix.into_boxed_slice(),
        }
    }
}

impl Noise {
    #[inline]
    fn sample(&self, t: f64) -> f64 {
        let bucket = (t / self.every).floor() as i64 as u64;
        let h1 = splitmix64(self.seed ^ bucket.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let h2 = splitmix64(h1);
        // Box-Muller from two uniforms in (0, 1].
        let u1 = ((h1 >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (h2 >> 11) as f64 / (1u64 << 53) as f64;
        self.stddev * (-2.0 * u1.ln()).sqrt() * (TAU * u2).cos()
    }
}

/// The splitmix64 finaliser: a cheap, well-mixed 64-bit hash.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The table form of a signal, as written in a scenario.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSignal {
    value: Option<f64>,
    from: Option<f64>,
    to: Option<f64>,
    over: Option<f64>,
    start: Option<f64>,
    mean: Option<f64>,
    amplitude: Option<f64>,
    period: Option<f64>,
    phase: Option<f64>,
    steps: Option<Vec<(f64, f64)>>,
    stddev: Option<f64>,
    seed: Option<u64>,
    every: Option<f64>,
    min: Option<f64>,
    max: Option<f64>,
}

const SHAPES_HELP: &str = "a signal is a number, or a table with one shape: \
`value = V` | `from = A, to = B, over = SECONDS` (ramp, optional `start`) | \
`mean = M, amplitude = A, period = SECONDS` (sine, optional `phase` in radians) | \
`steps = [[at_seconds, value], ...]`; add `stddev` (optional `seed`, `every`) for noise \
and `min`/`max` to clamp";

impl RawSignal {
    fn into_signal(self) -> Result<Signal, String> {
        let finite = |name: &str, v: Option<f64>| -> Result<(), String> {
            match v {
                Some(x) if !x.is_finite() => Err(format!("`{name}` must be a finite number")),
                _ => Ok(()),
            }
        };
        for (n, v) in [
            ("value", self.value),
            ("from", self.from),
            ("to", self.to),
            ("over", self.over),
            ("start", self.start),
            ("mean", self.mean),
            ("amplitude", self.amplitude),
            ("period", self.period),
            ("phase", self.phase),
            ("stddev", self.stddev),
            ("every", self.every),
            ("min", self.min),
            ("max", self.max),
        ] {
            finite(n, v)?;
        }
        let is_ramp = self.from.is_some() || self.to.is_some() || self.over.is_some();
        let is_sine = self.amplitude.is_some() || self.period.is_some();
        let is_steps = self.steps.is_some();
        let is_value = self.value.is_some();
        // `mean` alone is a constant (typically with noise); with amplitude/period it is a sine.
        let is_mean_const = self.mean.is_some() && !is_sine;
        let shapes = [is_ramp, is_sine, is_steps, is_value, is_mean_const]
            .iter()
            .filter(|b| **b)
            .count();
        if shapes == 0 {
            return Err(format!("this signal has no shape; {SHAPES_HELP}"));
        }
        if shapes > 1 {
            return Err(format!("this signal mixes several shapes; {SHAPES_HELP}"));
        }
        if self.start.is_some() && !is_ramp {
            return Err("`start` only applies to a ramp (`from`, `to`, `over`)".into());
        }
        if self.phase.is_some() && !is_sine {
            return Err("`phase` only applies to a sine (`mean`, `amplitude`, `period`)".into());
        }
        let shape = if is_ramp {
            let (Some(from), Some(to), Some(over)) = (self.from, self.to, self.over) else {
                return Err("a ramp needs all of `from`, `to` and `over` (seconds)".into());
            };
            if over <= 0.0 {
                return Err(format!("ramp `over` must be > 0 seconds, got {over}"));
            }
            Shape::Ramp {
                from,
                to,
                start: self.start.unwrap_or(0.0),
                over,
            }
        } else if is_sine {
            let (Some(mean), Some(amplitude), Some(period)) =
                (self.mean, self.amplitude, self.period)
            else {
                return Err(
                    "a sine needs all of `mean`, `amplitude` and `period` (seconds)".into(),
                );
            };
            if period <= 0.0 {
                return Err(format!("sine `period` must be > 0 seconds, got {period}"));
            }
            Shape::Sine {
                mean,
                amplitude,
                period,
                phase: self.phase.unwrap_or(0.0),
            }
        } else if let Some(steps) = self.steps {
            if steps.is_empty() {
                return Err("`steps` needs at least one [at_seconds, value] pair".into());
            }
            if steps.iter().any(|(a, v)| !a.is_finite() || !v.is_finite()) {
                return Err("`steps` entries must be finite [at_seconds, value] numbers".into());
            }
            Shape::steps(steps)
        } else if let Some(v) = self.value {
            Shape::Constant(v)
        } else {
            Shape::Constant(self.mean.unwrap_or(0.0))
        };
        let noise = match (self.stddev, self.seed, self.every) {
            (None, None, None) => None,
            (None, _, _) => return Err("`seed`/`every` need `stddev` (the noise amplitude)".into()),
            (Some(sd), seed, every) => {
                if sd < 0.0 {
                    return Err(format!("`stddev` must be >= 0, got {sd}"));
                }
                let every = every.unwrap_or(1.0);
                if every <= 0.0 {
                    return Err(format!("`every` must be > 0 seconds, got {every}"));
                }
                Some(Noise {
                    stddev: sd,
                    seed: seed.unwrap_or(0),
                    every,
                })
            }
        };
        if let (Some(lo), Some(hi)) = (self.min, self.max) {
            if lo > hi {
                return Err(format!("`min` ({lo}) is above `max` ({hi})"));
            }
        }
        Ok(Signal::new(shape, noise, self.min, self.max))
    }
}

impl<'de> Deserialize<'de> for Signal {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Signal;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(SHAPES_HELP)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Signal, E> {
                Ok(Signal::constant(v as f64))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Signal, E> {
                Ok(Signal::constant(v as f64))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Signal, E> {
                if v.is_finite() {
                    Ok(Signal::constant(v))
                } else {
                    Err(E::custom("a signal value must be a finite number"))
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Signal, A::Error> {
                let raw = RawSignal::deserialize(de::value::MapAccessDeserializer::new(map))?;
                raw.into_signal().map_err(de::Error::custom)
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Signal, String> {
        #[derive(Deserialize)]
        struct W {
            s: Signal,
        }
        toml::from_str::<W>(&format!("s = {s}"))
            .map(|w| w.s)
            .map_err(|e| e.message().to_string())
    }

    /// Numerical integral by the midpoint rule, to check the closed forms.
    fn numeric(s: &Signal, t: f64) -> f64 {
        let n = 200_000;
        let h = t / n as f64;
        (0..n)
            .map(|i| s.shape.value((i as f64 + 0.5) * h) * h)
            .sum()
    }

    #[test]
    fn constant_from_integer_float_and_tables() {
        assert_eq!(parse("85").unwrap().value(123.0), 85.0);
        assert_eq!(parse("12.5").unwrap().value(0.0), 12.5);
        assert_eq!(parse("{ value = 7 }").unwrap().value(9.0), 7.0);
        assert_eq!(parse("{ mean = 40 }").unwrap().value(9.0), 40.0);
    }

    #[test]
    fn ramp_holds_then_slopes_then_holds() {
        let s = parse("{ from = 10, to = 110, over = 100, start = 50 }").unwrap();
        assert_eq!(s.value(0.0), 10.0);
        assert_eq!(s.value(50.0), 10.0);
        assert!((s.value(100.0) - 60.0).abs() < 1e-9);
        assert_eq!(s.value(150.0), 110.0);
        assert_eq!(s.value(1e6), 110.0);
    }

    #[test]
    fn sine_hits_mean_peak_and_trough() {
        let s = parse("{ mean = 50, amplitude = 20, period = 40 }").unwrap();
        assert!((s.value(0.0) - 50.0).abs() < 1e-9);
        assert!((s.value(10.0) - 70.0).abs() < 1e-9);
        assert!((s.value(30.0) - 30.0).abs() < 1e-9);
    }

    #[test]
    fn steps_take_last_step_at_or_before_t_sorted() {
        let s = parse("{ steps = [[30, 80], [0, 10], [60, 20]] }").unwrap();
        assert_eq!(s.value(0.0), 10.0);
        assert_eq!(s.value(29.99), 10.0);
        assert_eq!(s.value(30.0), 80.0);
        assert_eq!(s.value(59.0), 80.0);
        assert_eq!(s.value(600.0), 20.0);
        let late = parse("{ steps = [[5, 3]] }").unwrap();
        assert_eq!(
            late.value(1.0),
            3.0,
            "before the first step its value holds"
        );
    }

    #[test]
    fn integrals_match_numeric_integration() {
        for src in [
            "300",
            "{ from = 100, to = 700, over = 60, start = 20 }",
            "{ from = 100, to = 700, over = 60, start = -20 }",
            "{ mean = 400, amplitude = 100, period = 37, phase = 1.0 }",
            "{ steps = [[0, 100], [10, 500], [55.5, 250]] }",
            "{ steps = [[20, 100], [30, 500]] }",
        ] {
            let s = parse(src).unwrap();
            for t in [0.5, 15.0, 40.0, 100.0, 333.3] {
                let (a, n) = (s.integral(t), numeric(&s, t));
                assert!(
                    (a - n).abs() < 1e-3 * n.abs().max(1.0),
                    "{src} at {t}: {a} vs {n}"
                );
            }
        }
    }

    #[test]
    fn noise_is_deterministic_seeded_and_roughly_gaussian() {
        let a = parse("{ mean = 50, stddev = 5, seed = 1 }").unwrap();
        let b = parse("{ mean = 50, stddev = 5, seed = 1 }").unwrap();
        let c = parse("{ mean = 50, stddev = 5, seed = 2 }").unwrap();
        assert_eq!(a.value(12.3), b.value(12.3));
        assert_ne!(a.value(12.3), c.value(12.3));
        // Constant within one bucket.
        assert_eq!(a.value(12.1), a.value(12.9));
        let n = 20_000;
        let xs: Vec<f64> = (0..n).map(|i| a.value(i as f64)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 50.0).abs() < 0.2, "mean {mean}");
        assert!((var.sqrt() - 5.0).abs() < 0.2, "stddev {}", var.sqrt());
        assert_ne!(a.salted(3).value(7.0), a.value(7.0));
    }

    #[test]
    fn steps_plus_noise_and_clamps_compose() {
        let s = parse("{ steps = [[0, 0], [10, 100]], stddev = 30, seed = 9, min = 0, max = 100 }")
            .unwrap();
        for i in 0..1000 {
            let v = s.value(i as f64 * 0.37);
            assert!((0.0..=100.0).contains(&v), "{v}");
        }
        // The integral ignores noise: it is the steps' integral.
        assert!((s.integral(20.0) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn bad_signals_say_what_is_wrong() {
        let cases = [
            (
                "{ from = 1, to = 2 }",
                "needs all of `from`, `to` and `over`",
            ),
            ("{ from = 1, to = 2, over = 0 }", "`over` must be > 0"),
            (
                "{ mean = 1, amplitude = 2 }",
                "needs all of `mean`, `amplitude` and `period`",
            ),
            ("{ value = 1, steps = [[0, 1]] }", "mixes several shapes"),
            ("{ stddev = 1 }", "has no shape"),
            ("{ steps = [] }", "at least one"),
            ("{ value = 3, seed = 1 }", "need `stddev`"),
            ("{ value = 3, min = 5, max = 1 }", "is above `max`"),
            ("{ value = 3, start = 1 }", "only applies to a ramp"),
            ("{ valeu = 3 }", "unknown field `valeu`"),
            ("\"fast\"", "a signal is a number"),
        ];
        for (src, want) in cases {
            let err = parse(src).expect_err(src);
            assert!(err.contains(want), "{src}: {err}");
        }
    }
}
