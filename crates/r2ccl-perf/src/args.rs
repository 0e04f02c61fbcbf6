//! nccl-tests command-line flags: `-b -e -f -i -n -w -c -o -d -r -N -T`, plus `--json FILE`.

use r2ccl_core::{DType, ReduceOp};
use std::str::FromStr;

/// The collectives r2ccl-perf measures, named as the nccl-tests binaries are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Coll {
    /// `all_reduce_perf`.
    AllReduce,
    /// `all_gather_perf`.
    AllGather,
    /// `reduce_scatter_perf`.
    ReduceScatter,
    /// `broadcast_perf`.
    Broadcast,
    /// `reduce_perf`.
    Reduce,
    /// `alltoall_perf`.
    AllToAll,
    /// `sendrecv_perf`.
    SendRecv,
}

impl Coll {
    /// Every collective.
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    /// The subcommand name.
    pub const fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "alltoall",
            Coll::SendRecv => "sendrecv",
        }
    }

    /// Whether the collective takes a reduce op.
    pub const fn has_op(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether the collective takes a root.
    pub const fn has_root(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// nccl-tests' bus bandwidth factor for `nranks` ranks.
    pub fn busbw_factor(self, nranks: u32) -> f64 {
        let n = f64::from(nranks.max(1));
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }
}

impl FromStr for Coll {
    type Err = ArgsError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim_end_matches("_perf");
        Coll::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| ArgsError::Value {
            flag: "collective".into(),
            value: s.into(),
            allowed: Coll::ALL.iter().map(|c| c.name()).collect::<Vec<_>>().join(", "),
        })
    }
}

/// A bad command line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgsError {
    /// A flag nobody knows.
    #[error(
        "unknown flag `{0}` (r2ccl-perf takes the nccl-tests flags -b -e -f -i -n -w -c -o -d -r -N -T and --json)"
    )]
    Unknown(String),
    /// A flag without its value.
    #[error("flag `{0}` needs a value")]
    Missing(String),
    /// A value that does not parse or is out of range.
    #[error("flag `{flag}`: bad value `{value}`; allowed: {allowed}")]
    Value {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
        /// What is allowed.
        allowed: String,
    },
}

/// Parsed flags. Defaults follow nccl-tests where they make sense on CPU ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct PerfArgs {
    /// `-b`: smallest size in bytes.
    pub min_bytes: u64,
    /// `-e`: largest size in bytes.
    pub max_bytes: u64,
    /// `-f`: multiply the size by this factor each step (0 = use `-i`).
    pub step_factor: u64,
    /// `-i`: add this many bytes each step (used when `-f` is 0).
    pub step_bytes: u64,
    /// `-n`: timed iterations per size.
    pub iters: u32,
    /// `-w`: warm-up iterations per size.
    pub warmup: u32,
    /// `-c`: check results (count wrong elements).
    pub check: bool,
    /// `-R`: 1 = buffers registered with the communicator (`Communicator::alloc`), read and
    /// written in place with no copy in or out (nccl-tests' `-R`, local registration).
    pub registered: bool,
    /// `-o`: reduce ops (`all` = every op).
    pub ops: Vec<ReduceOp>,
    /// `-d`: data types (`all` = every type).
    pub dtypes: Vec<DType>,
    /// `-r`: root rank for rooted collectives.
    pub root: u32,
    /// `-N`: cycles over the size range; 0 = run until stopped, printing bus bandwidth every second.
    pub cycles: u32,
    /// `-T`: timeout in seconds for each collective (0 = the library default).
    pub timeout_s: u64,
    /// `--json FILE`: also write the results as JSON.
    pub json: Option<String>,
    /// `-a`: how the ranks' times combine in the report (nccl-tests' `-a`): 0 rank 0's, 1 the
    /// average (the default), 2 the minimum, 3 the maximum.
    pub average: u8,
    /// `--device host|cuda`: where the buffers live (`cuda`: the GPU of local rank modulo the
    /// device count, each collective timed until its stream has run past it).
    pub device: Device,
}

/// Where the benchmark's buffers live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// Host memory.
    #[default]
    Host,
    /// CUDA device memory (needs a build with the `cuda` feature).
    Cuda,
}

impl Default for PerfArgs {
    fn default() -> Self {
        Self {
            min_bytes: 32 << 20,
            max_bytes: 32 << 20,
            step_factor: 1,
            step_bytes: 1 << 20,
            iters: 20,
            warmup: 5,
            check: true,
            registered: false,
            ops: vec![ReduceOp::Sum],
            dtypes: vec![DType::F32],
            root: 0,
            cycles: 1,
            timeout_s: 0,
            json: None,
            device: Device::Host,
            average: 1,
        }
    }
}

/// Parse a size with an optional suffix: `K`, `M`, `G` (powers of 1024, as nccl-tests), `KiB`,
/// `MiB`, `GiB`, or `KB`/`MB`/`GB` (powers of 1000).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> Result<&'a String, ArgsError> {
    it.next().ok_or_else(|| ArgsError::Missing(flag.into()))
}

fn bad(flag: &str, value: &str, allowed: &str) -> ArgsError {
    ArgsError::Value { flag: flag.into(), value: value.into(), allowed: allowed.into() }
}

fn number<T: FromStr>(flag: &str, v: &str, allowed: &str) -> Result<T, ArgsError> {
    v.parse().map_err(|_| bad(flag, v, allowed))
}

impl PerfArgs {
    /// Parse flags (everything after the collective name). Unknown flags are errors.
    pub fn parse(argv: &[String]) -> Result<Self, ArgsError> {
        let mut a = PerfArgs::default();
        let mut it = argv.iter();
        while let Some(flag) = it.next() {
            let f = flag.as_str();
            match f {
                "-b" | "--minbytes" => {
                    let v = value(&mut it, f)?;
                    a.min_bytes = parse_size(v).ok_or_else(|| bad(f, v, "a size such as 8, 64K, 1M, 256MiB"))?;
                }
                "-e" | "--maxbytes" => {
                    let v = value(&mut it, f)?;
                    a.max_bytes = parse_size(v).ok_or_else(|| bad(f, v, "a size such as 8, 64K, 1M, 256MiB"))?;
                }
                "-f" | "--stepfactor" => a.step_factor = number(f, value(&mut it, f)?, "an integer >= 0")?,
                "-i" | "--stepbytes" => {
                    let v = value(&mut it, f)?;
                    a.step_bytes = parse_size(v).ok_or_else(|| bad(f, v, "a size"))?;
                }
                "-n" | "--iters" => a.iters = number(f, value(&mut it, f)?, "an integer >= 1")?,
                "-w" | "--warmup_iters" => a.warmup = number(f, value(&mut it, f)?, "an integer >= 0")?,
                "-c" | "--check" => a.check = number::<u32>(f, value(&mut it, f)?, "0 or 1")? != 0,
                "-R" | "--local_register" => {
                    a.registered = match value(&mut it, f)?.as_str() {
                        "0" => false,
                        "1" => true,
                        v => return Err(bad(f, v, "0 or 1")),
                    };
                }
                "-o" | "--op" => {
                    let v = value(&mut it, f)?;
                    a.ops = if v == "all" {
                        ReduceOp::ALL.to_vec()
                    } else {
                        vec![v.parse().map_err(|_| bad(f, v, "sum, prod, min, max, avg, all"))?]
                    };
                }
                "-d" | "--datatype" => {
                    let v = value(&mut it, f)?;
                    a.dtypes = if v == "all" {
                        DType::ALL.to_vec()
                    } else {
                        vec![v.parse().map_err(|_| {
                            bad(f, v, "int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 all")
                        })?]
                    };
                }
                "-r" | "--root" => a.root = number(f, value(&mut it, f)?, "a rank")?,
                "-N" | "--run_cycles" => {
                    a.cycles = number(f, value(&mut it, f)?, "an integer >= 0 (0 = until stopped)")?
                }
                "-T" | "--timeout" => a.timeout_s = number(f, value(&mut it, f)?, "seconds >= 0")?,
                "--json" => a.json = Some(value(&mut it, f)?.clone()),
                "-a" | "--average" => {
                    a.average = match value(&mut it, f)?.as_str() {
                        "0" => 0,
                        "1" => 1,
                        "2" => 2,
                        "3" => 3,
                        v => return Err(bad(f, v, "0 (rank 0), 1 (average), 2 (min) or 3 (max)")),
                    };
                }
                // nccl-tests' flags for threads, GPUs per thread, blocking, CUDA graphs,
                // aggregation and parallel init: one device per rank, every call blocking
                // here; the values nccl-tests users type by default are accepted.
                "-g" | "--ngpus" | "-t" | "--nthreads" | "-m" | "--agg_iters" => {
                    let v = value(&mut it, f)?;
                    if v != "1" {
                        return Err(bad(
                            f,
                            v,
                            "1 (r2ccl-perf runs one rank per process, one device each, one call at a time)",
                        ));
                    }
                }
                "-z" | "--blocking" | "-p" | "--parallel_init" => {
                    let v = value(&mut it, f)?;
                    if v != "0" && v != "1" {
                        return Err(bad(f, v, "0 or 1 (r2ccl-perf's calls block either way)"));
                    }
                }
                "-G" | "--cudagraph" => {
                    let v = value(&mut it, f)?;
                    if v != "0" {
                        return Err(bad(f, v, "0 (r2ccl's device calls cannot be captured in a CUDA graph)"));
                    }
                }
                "--device" => {
                    a.device = match value(&mut it, f)?.as_str() {
                        "host" | "cpu" => Device::Host,
                        "cuda" | "gpu" => Device::Cuda,
                        v => return Err(bad(f, v, "host or cuda")),
                    };
                }
                _ => return Err(ArgsError::Unknown(flag.clone())),
            }
        }
        if a.iters == 0 {
            return Err(bad("-n", "0", "an integer >= 1"));
        }
        if a.max_bytes < a.min_bytes {
            return Err(bad("-e", &a.max_bytes.to_string(), &format!(">= -b ({})", a.min_bytes)));
        }
        if a.step_factor == 1 && a.max_bytes > a.min_bytes {
            return Err(bad("-f", "1", "a factor >= 2, or 0 with -i for additive steps"));
        }
        if a.step_factor == 0 && a.step_bytes == 0 {
            return Err(bad("-i", "0", "a positive size when -f is 0"));
        }
        Ok(a)
    }

    /// The byte sizes to run, from `-b` to `-e`.
    pub fn sizes(&self) -> Vec<u64> {
        let mut out = vec![self.min_bytes];
        let mut s = self.min_bytes;
        while s < self.max_bytes {
            let next =
                if self.step_factor >= 2 { s.max(1).saturating_mul(self.step_factor) } else { s + self.step_bytes };
            if next <= s || next > self.max_bytes {
                break;
            }
            s = next;
            out.push(s);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<PerfArgs, ArgsError> {
        PerfArgs::parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn sizes_follow_nccl_tests() {
        assert_eq!(parse_size("8"), Some(8));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("256MiB"), Some(256 << 20));
        assert_eq!(parse_size("1GB"), Some(1_000_000_000));
        assert_eq!(parse_size("1T"), None);
        let a = args("-b 1M -e 256M -f 4").unwrap();
        assert_eq!(a.sizes(), vec![1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]);
        let a = args("-b 1K -e 4K -f 0 -i 1K").unwrap();
        assert_eq!(a.sizes(), vec![1024, 2048, 3072, 4096]);
    }

    #[test]
    fn flags_and_errors() {
        let a = args("-o all -d bfloat16 -n 3 -w 1 -c 0 -r 2 -N 0 -T 5 --json out.json").unwrap();
        assert!(!a.registered);
        assert!(args("-R 1").unwrap().registered);
        assert!(args("-R 2").is_err());
        assert_eq!(a.ops.len(), 5);
        assert_eq!(a.dtypes, vec![DType::Bf16]);
        assert_eq!((a.iters, a.warmup, a.check, a.root, a.cycles, a.timeout_s), (3, 1, false, 2, 0, 5));
        assert_eq!(a.json.as_deref(), Some("out.json"));
        assert_eq!(a.device, Device::Host);
        assert_eq!(a.average, 1);
        // The nccl-tests command lines people copy run unchanged.
        let a = args("-b 8 -e 128M -f 2 -g 1 -t 1 -z 0 -G 0 -m 1 -a 3 -p 0").unwrap();
        assert_eq!((a.min_bytes, a.max_bytes, a.step_factor, a.average), (8, 128 << 20, 2, 3));
        assert!(args("-g 2").unwrap_err().to_string().contains("one device each"));
        assert!(args("-G 10").is_err());
        assert_eq!(args("--device cuda").unwrap().device, Device::Cuda);
        assert!(args("--device tpu").is_err());
        assert!(matches!(args("-x 1"), Err(ArgsError::Unknown(f)) if f == "-x"));
        assert!(matches!(args("-b"), Err(ArgsError::Missing(_))));
        assert!(args("-d float8").unwrap_err().to_string().contains("bfloat16"));
        assert!(args("-b 2M -e 1M").is_err());
        assert!(args("-n 0").is_err());
        assert_eq!("all_reduce_perf".parse::<Coll>(), Ok(Coll::AllReduce));
        assert!("allreduce".parse::<Coll>().is_err());
    }

    #[test]
    fn busbw_factors() {
        assert!((Coll::AllReduce.busbw_factor(4) - 1.5).abs() < 1e-12);
        assert!((Coll::AllGather.busbw_factor(4) - 0.75).abs() < 1e-12);
        assert!((Coll::Broadcast.busbw_factor(4) - 1.0).abs() < 1e-12);
    }
}
