//! PBT's exploit on disk: a trial's checkpoint directory replaced by a copy of another
//! trial's, before the trial's next attempt. Links are copied as links, never followed, so
//! a checkpoint cannot pull files from outside its tree.

use std::io;
use std::path::{Path, PathBuf};

use crate::model::{StudyDir, TrialDirs, TrialId};

/// Replace `child`'s checkpoints with a copy of `parent_id`'s, on a blocking thread. Safe to
/// repeat: a copy cut short by a restart is made again from the start.
pub async fn copy_from_parent(
    study: &StudyDir,
    parent_id: TrialId,
    child: &TrialDirs,
) -> io::Result<()> {
    let from = TrialDirs::new(study, parent_id).checkpoints;
    let to = child.checkpoints.clone();
    tokio::task::spawn_blocking(move || replace_with_copy(&from, &to))
        .await
        .map_err(io::Error::other)?
}

fn replace_with_copy(from: &Path, to: &Path) -> io::Result<()> {
    if !std::fs::symlink_metadata(from)?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            from.display()
        )));
    }
    match std::fs::symlink_metadata(to) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(to)?,
        Ok(_) => std::fs::remove_file(to)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    copy_tree(from, to)
}

fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir(to)?;
    let mut pending: Vec<(PathBuf, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        pending.push((entry.path(), to.join(entry.file_name())));
    }
    for (source, target) in pending {
        let kind = std::fs::symlink_metadata(&source)?.file_type();
        if kind.is_dir() {
            copy_tree(&source, &target)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        }
        // Sockets, fifos and devices are no checkpoint: left out.
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_replaces_what_was_there_and_keeps_links_as_links() {
        let base = std::env::temp_dir().join(format!("augur-ckpt-{}", std::process::id()));
        let (from, to) = (base.join("from"), base.join("to"));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(from.join("step-3")).expect("dirs");
        std::fs::write(from.join("step-3/weights"), b"parent").expect("write");
        std::os::unix::fs::symlink("step-3", from.join("latest")).expect("link");
        std::fs::create_dir_all(&to).expect("dirs");
        std::fs::write(to.join("stale"), b"child").expect("write");
        replace_with_copy(&from, &to).expect("copy");
        assert_eq!(
            std::fs::read(to.join("latest/weights")).expect("read"),
            b"parent"
        );
        assert_eq!(
            std::fs::read_link(to.join("latest")).expect("link"),
            Path::new("step-3")
        );
        assert!(
            !to.join("stale").exists(),
            "the child's own checkpoint is gone"
        );
        // Again, as after a restart mid-copy.
        replace_with_copy(&from, &to).expect("copy again");
        assert_eq!(
            std::fs::read(to.join("step-3/weights")).expect("read"),
            b"parent"
        );
        let _ = std::fs::remove_dir_all(&base);
    }
}
