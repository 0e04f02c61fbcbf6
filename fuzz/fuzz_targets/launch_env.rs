//! Launch environments (launcher variables, unique id, secret): never a panic, and no error
//! echoes a secret it was given.
#![no_main]
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 16] = [
    "R2CCL_RANK", "R2CCL_WORLD_SIZE", "R2CCL_ROOT", "R2CCL_SECRET", "R2CCL_UNIQUE_ID", "MASTER_ADDR", "MASTER_PORT",
    "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "R2CCL_INSECURE_DERIVED_SECRET",
];

fuzz_target!(|data: &[u8]| {
    // Records separated by 0xFF: a name index byte, then the value.
    let pairs: Vec<(String, String)> = data
        .split(|&b| b == 0xFF)
        .filter_map(|rec| {
            let (&i, v) = rec.split_first()?;
            Some((NAMES[usize::from(i) % NAMES.len()].to_owned(), String::from_utf8_lossy(v).into_owned()))
        })
        .collect();
    r2ccl::fuzzing::launch_env(&pairs);
});
