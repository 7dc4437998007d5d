//! Trial jobs: a command that dumps its environment and the checks on what a job may see,
//! the runtimes some jobs need (a Python with `cloudml-hypertune`, Podman), and a study's
//! directory of runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// A trial command (for `trial_job.command`) that writes its whole environment to
/// `<AIP_MODEL_DIR>/env.bin` (NUL-separated) and reports `loss=0.5`. A plain shell: a
/// language runtime's launcher (a pyenv shim) would add variables of its own.
pub fn env_dump_command() -> Value {
    json!([
        "/bin/sh",
        "-c",
        "env -0 > \"$AIP_MODEL_DIR/env.bin\"; echo loss=0.5"
    ])
}

/// The environment `env_dump_command` wrote under `model_dir`, once it is there.
pub fn read_job_env(model_dir: &std::path::Path) -> Result<serde_json::Map<String, Value>, String> {
    let bytes = std::fs::read(model_dir.join("env.bin")).map_err(|e| e.to_string())?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter_map(|entry| {
            let entry = String::from_utf8_lossy(entry);
            let (k, v) = entry.split_once('=')?;
            Some((k.to_string(), Value::String(v.to_string())))
        })
        .collect())
}

/// A job's environment leaks nothing of the server's (DESIGN §4): every variable the job
/// shares, with the same value, with the environment the server was started from (this test
/// process's, plus `server_env`) is on the allow-list or in `extra` (the spec's `env`,
/// pass-through names). Variables a job's own shell sets for itself (PWD, SHLVL, …) are no
/// leak. Augur's own variables must be there.
pub fn assert_clean_job_env(
    env: &serde_json::Map<String, Value>,
    server_env: &[(&str, &str)],
    extra: &[&str],
) {
    const INHERITED: [&str; 10] = [
        "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    ];
    const SET_BY_SHELL: [&str; 5] = ["PWD", "OLDPWD", "SHLVL", "_", "HOSTNAME"];
    let servers = |k: &str| {
        server_env
            .iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| v.to_string())
            .or_else(|| std::env::var(k).ok())
    };
    for (key, value) in env {
        let shared = servers(key).is_some_and(|v| Some(v.as_str()) == value.as_str());
        let allowed = INHERITED.contains(&key.as_str())
            || key.starts_with("LC_")
            || SET_BY_SHELL.contains(&key.as_str())
            || extra.contains(&key.as_str());
        assert!(!shared || allowed, "the job saw the server's {key}={value}");
    }
    for (key, _) in server_env {
        assert!(
            extra.contains(key) || !env.contains_key(*key),
            "the job saw {key}"
        );
    }
    assert_augur_job_env(env);
}

/// The variables Augur sets for every job (DESIGN §4) are there.
pub fn assert_augur_job_env(env: &serde_json::Map<String, Value>) {
    for key in [
        "PATH",
        "AUGUR_URL",
        "AUGUR_STUDY_ID",
        "AUGUR_TRIAL_ID",
        "AUGUR_TRIAL_TOKEN",
        "CLOUD_ML_TRIAL_ID",
        "CLOUD_ML_HP_METRIC_FILE",
        "AIP_MODEL_DIR",
        "AIP_CHECKPOINT_DIR",
        "AIP_TENSORBOARD_LOG_DIR",
    ] {
        assert!(env.contains_key(key), "the job lacks {key}: {env:?}");
    }
}

/// A Python with the real `cloudml-hypertune` from PyPI, in a venv made once per checkout (by
/// one test at a time: two making the venv at once break it).
pub fn python_with_hypertune() -> PathBuf {
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-venv");
    let python = venv.join("bin/python3");
    let ready = Command::new(&python)
        .args(["-c", "import hypertune"])
        .status()
        .is_ok_and(|s| s.success());
    if !ready {
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 -m venv");
        assert!(made.success(), "could not create {}", venv.display());
        let pip = Command::new(venv.join("bin/pip"))
            .args([
                "install",
                "-q",
                "-r",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/examples/hypertune/requirements.txt"
                ),
            ])
            .status()
            .expect("pip");
        assert!(pip.success(), "pip install cloudml-hypertune failed");
    }
    python
}

/// The container engine of this machine's Podman as `scripts/podman-setup.sh` sets it up
/// (installing it and building the base image on first use), and the base image's name.
pub fn podman() -> (augur::dispatch::container::ContainerEngine, String) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/podman-setup.sh");
    let out = Command::new(&script)
        .output()
        .expect("run scripts/podman-setup.sh");
    assert!(
        out.status.success(),
        "scripts/podman-setup.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let value = |key: &str| -> String {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("podman-setup printed no {key}: {text}"))
            .to_string()
    };
    let words =
        |key: &str| -> Vec<String> { value(key).split_whitespace().map(str::to_string).collect() };
    let engine = augur::dispatch::container::ContainerEngine {
        program: "podman".into(),
        global_args: words("AUGUR_PODMAN_GLOBAL_ARGS"),
        run_args: words("AUGUR_PODMAN_RUN_ARGS"),
    };
    (engine, value("AUGUR_BASE_IMAGE"))
}

/// Study `id`'s directory in `runs` (`study-<id>-<created>`: `model::StudyKey`), found by
/// its prefix; a path that does not exist while the study has made none.
pub fn study_dir(runs: &Path, id: i64) -> PathBuf {
    let prefix = format!("study-{id}-");
    std::fs::read_dir(runs)
        .ok()
        .and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|name| name.starts_with(&prefix))
        })
        .map(|name| runs.join(name))
        .unwrap_or_else(|| runs.join(format!("study-{id}-not-made-yet")))
}
