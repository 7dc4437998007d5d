//! `--job-commands` with the variables a spec may set: the attacks of issue 26 (finding 5)
//! played for real against Python's and Bash's start-up, then refused by the server.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common;
use reqwest::StatusCode;
use serde_json::json;

/// Python's `major.minor`, for its user site-packages directory.
fn python_version() -> String {
    let out = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')",
        ])
        .output()
        .expect("/usr/bin/python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Plant, under `home`, a `.pth` file that Python runs at start-up when `HOME` is `home`,
/// and a Bash function definition; return the variables that would make the allowed
/// programs run them.
fn plant(dir: &Path, home: &Path) -> Vec<(String, String)> {
    let site = home.join(format!(
        ".local/lib/python{}/site-packages",
        python_version()
    ));
    std::fs::create_dir_all(&site).expect("site-packages");
    let pwned = dir.join("pwned-python");
    std::fs::write(
        site.join("evil.pth"),
        format!(
            "import os; open({:?}, 'w').write('x')\n",
            pwned.display().to_string()
        ),
    )
    .expect("evil.pth");
    vec![
        ("HOME".into(), home.display().to_string()),
        (
            "BASH_FUNC_check_data%%".into(),
            format!("() {{ touch {}; }}", dir.join("pwned-bash").display()),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_env_cannot_make_an_allowed_python_or_bash_run_other_code() {
    let dir = tempfile::tempdir().expect("dir");
    let train_py = dir.path().join("train.py");
    std::fs::write(
        &train_py,
        "import os\nprint('loss=' + os.environ.get('MYAPP_LOSS', '9'))\n",
    )
    .expect("train.py");
    let train_sh = dir.path().join("train.sh");
    std::fs::write(&train_sh, "check_data\necho loss=1\n").expect("train.sh");
    let attack = plant(dir.path(), &dir.path().join("home"));

    // The attacks are real: with these variables the allowed programs run the planted code.
    let status = Command::new("/usr/bin/python3")
        .arg(&train_py)
        .env("HOME", &attack[0].1)
        .status()
        .expect("python3");
    assert!(status.success());
    assert!(
        dir.path().join("pwned-python").exists(),
        "HOME ran the .pth"
    );
    let status = Command::new("/bin/bash")
        .arg(&train_sh)
        .env(&attack[1].0, &attack[1].1)
        .status()
        .expect("bash");
    assert!(status.success());
    assert!(
        dir.path().join("pwned-bash").exists(),
        "BASH_FUNC_ defined the function"
    );
    std::fs::remove_file(dir.path().join("pwned-python")).expect("rm");
    std::fs::remove_file(dir.path().join("pwned-bash")).expect("rm");

    let (py, sh) = (
        train_py.display().to_string(),
        train_sh.display().to_string(),
    );
    let app = common::spawn_app_configured(common::sqlite_db(), |c| {
        c.base_dir = Some(dir.path().to_path_buf());
        c.job_commands = vec![format!("/usr/bin/python3 {py}"), format!("/bin/bash {sh}")];
        c.job_env_allow = vec!["MYAPP_*".into()];
    })
    .await;
    let spec = |command: Vec<String>, env: serde_json::Value| {
        let mut s = common::spec("random", 1, 1);
        s["metrics"] = json!([{"id": "loss", "goal": "minimize"}]);
        s["trial_job"] = json!({"command": command, "env": env, "output_dir": "runs"});
        s
    };
    let python = vec!["/usr/bin/python3".to_string(), py.clone()];
    let bash = vec!["/bin/bash".to_string(), sh.clone()];
    let mut refused = attack.clone();
    for name in [
        "OPENSSL_CONF",
        "GCONV_PATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "NODE_OPTIONS",
        "LD_AUDIT",
        "LD_PRELOAD",
        "GIT_CONFIG_COUNT",
        "JDK_JAVA_OPTIONS",
        "CLASSPATH",
        "TMPDIR",
        "XDG_CONFIG_HOME",
        "MYAPP",
    ] {
        refused.push((name.to_string(), "/tmp/x".to_string()));
    }
    for (name, value) in &refused {
        for command in [&python, &bash] {
            let r = app
                .post(
                    "/v1/studies",
                    spec(command.clone(), json!({ name.as_str(): value })),
                )
                .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{name}: {}", r.body);
            assert_eq!(
                r.body["error"]["field"],
                format!("trial_job.env.{name}"),
                "{}",
                r.body
            );
        }
    }
    // What loads no code, and what the operator allows, reaches the job.
    let id = app
        .create_study(spec(
            python,
            json!({"MYAPP_LOSS": "0.25", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}),
        ))
        .await;
    let study = app
        .wait_for_state(id, "completed", Duration::from_secs(60))
        .await;
    assert_eq!(
        study["best_trial"]["final_measurement"]["metrics"]["loss"], 0.25,
        "{study}"
    );
    assert!(!dir.path().join("pwned-python").exists());
}
