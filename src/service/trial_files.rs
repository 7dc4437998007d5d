//! The server's files in trial directories, reached without following links.

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, mkdirat};

/// How a file below a trial's directory is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileAccess {
    /// The server's log: appended to, made when missing (`0644`).
    Append,
    /// The server's file, rewritten whole (made with this mode when missing; the mode is
    /// set again on an existing one).
    Rewrite(u32),
    /// The server's file, read.
    Read,
    /// A file the job writes (its hypertune file), read: it may be the job's user's, but it
    /// is never a link.
    ReadJobs,
    /// A file the job writes, made (empty) when missing and opened to be handed to it.
    JobsFile,
}

/// Whose a directory below the output directory must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirOwner {
    /// The server's: owned by its user, writable by nobody else.
    Server,
    /// A directory the job writes (model, checkpoints, logs): any owner, never a link.
    Jobs,
}

fn refused(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}: refused", path.display()),
    )
}

fn os(path: &Path, e: Errno) -> io::Error {
    match e {
        // O_NOFOLLOW on a link.
        Errno::ELOOP => refused(path, "a symbolic link, not the server's"),
        Errno::ENOTDIR => refused(path, "not a directory, not the server's"),
        e => io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", path.display()),
        ),
    }
}

/// Whether `stat` is what the server made: its user's, and no other user may write it
/// (world-writable never; group-writable only for the server's own group).
fn check_servers(path: &Path, stat: &FileStat) -> io::Result<()> {
    let uid = nix::unistd::geteuid().as_raw();
    if stat.st_uid != uid {
        return Err(refused(
            path,
            format!(
                "belongs to uid {}, not the server's (uid {uid}): not a directory or file the \
                 server made",
                stat.st_uid
            ),
        ));
    }
    let mode = stat.st_mode;
    let group_writable = mode & 0o020 != 0 && stat.st_gid != nix::unistd::getegid().as_raw();
    if mode & 0o002 != 0 || group_writable {
        return Err(refused(
            path,
            format!(
                "writable by other users (mode {:o}), not the server's alone",
                mode & 0o777
            ),
        ));
    }
    Ok(())
}

/// Whether `name` in `parent` is a symbolic link (not followed).
fn is_link(parent: &OwnedFd, name: &std::ffi::OsStr) -> bool {
    nix::sys::stat::fstatat(parent, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|stat| is_kind(&stat, SFlag::S_IFLNK))
}

fn is_kind(stat: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == kind
}

/// `path` relative to `base`, as plain names: `path` must lie below `base`.
fn below<'a>(base: &Path, path: &'a Path) -> io::Result<Vec<&'a std::ffi::OsStr>> {
    let rel = path.strip_prefix(base).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not below {}", path.display(), base.display()),
        )
    })?;
    rel.components()
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: only plain names below {}",
                    path.display(),
                    base.display()
                ),
            )),
        })
        .collect()
}

/// Open the output directory `base` itself: the operator's path, as given (links in it are
/// the spec's choice), made when `create`.
fn open_base(base: &Path, create: bool) -> io::Result<OwnedFd> {
    if create {
        std::fs::create_dir_all(base)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", base.display())))?;
    }
    nix::fcntl::open(
        base,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| os(base, e))
}

/// Open (and, when `create`, make) one directory `name` in `parent`, without following a
/// link, and check it is `owner`'s.
fn open_child_dir(
    parent: &OwnedFd,
    name: &std::ffi::OsStr,
    shown: &Path,
    owner: DirOwner,
    create: bool,
) -> io::Result<OwnedFd> {
    if create {
        match mkdirat(parent, name, Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(os(shown, e)),
        }
    }
    let fd = openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        // O_DIRECTORY answers ENOTDIR for a link too: say which it is.
        Errno::ENOTDIR if is_link(parent, name) => os(shown, Errno::ELOOP),
        e => os(shown, e),
    })?;
    if owner == DirOwner::Server {
        let stat = fstat(&fd).map_err(|e| os(shown, e))?;
        check_servers(shown, &stat)?;
    }
    Ok(fd)
}

/// Open the directory `dir` below `base`: every directory from `base` down is the server's,
/// the last one `last`'s; made when missing if `create`.
///
/// A job may write its own directories (model, checkpoints, TensorBoard logs, the hypertune
/// file), perhaps as another user (`--run-jobs-as`), and a study's `output_dir` may lie in a
/// directory some job can write. So below a study's output directory nothing is trusted by
/// its path: each directory is opened from the one above it with `O_NOFOLLOW` (`openat`), and
/// the server's own (a study's directory, a trial's, `replicas/`) must belong to the server's
/// user and be writable by nobody else, or it is refused; the server's files there (logs,
/// the job handle, batch scripts, env files) are opened the same way and must be its own. A
/// job can then neither plant a link nor a file where the server writes or reads, and a
/// directory that already exists but is not what the server made is refused with an error
/// that names it.
pub fn open_dir(base: &Path, dir: &Path, last: DirOwner, create: bool) -> io::Result<OwnedFd> {
    let names = below(base, dir)?;
    let mut fd = open_base(base, create)?;
    let mut shown = base.to_path_buf();
    for (i, name) in names.iter().enumerate() {
        shown.push(name);
        let owner = if i + 1 == names.len() {
            last
        } else {
            DirOwner::Server
        };
        fd = open_child_dir(&fd, name, &shown, owner, create)?;
    }
    Ok(fd)
}

/// Open the file `path` below `base` as `access` says. Every directory from `base` down to
/// the file's must be the server's (made when missing, except to read); the file is never a
/// link, and the server's own files must be its own.
pub fn open_file(base: &Path, path: &Path, access: FileAccess) -> io::Result<File> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        ));
    };
    let reading = matches!(access, FileAccess::Read | FileAccess::ReadJobs);
    let dir_fd = open_dir(base, dir, DirOwner::Server, !reading)?;
    let nofollow = OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let (flags, mode) = match access {
        FileAccess::Append => (OFlag::O_WRONLY | OFlag::O_APPEND | OFlag::O_CREAT, 0o644),
        FileAccess::Rewrite(mode) => (OFlag::O_WRONLY | OFlag::O_CREAT, mode),
        FileAccess::Read | FileAccess::ReadJobs => (OFlag::O_RDONLY, 0),
        FileAccess::JobsFile => (OFlag::O_RDONLY | OFlag::O_CREAT, 0o644),
    };
    let fd = openat(
        &dir_fd,
        name,
        flags | nofollow,
        Mode::from_bits_truncate(mode),
    )
    .map_err(|e| os(path, e))?;
    let stat = fstat(&fd).map_err(|e| os(path, e))?;
    if !is_kind(&stat, SFlag::S_IFREG) {
        return Err(refused(path, "not a regular file"));
    }
    if !matches!(access, FileAccess::ReadJobs | FileAccess::JobsFile) {
        check_servers(path, &stat)?;
        // A hard link to another of the server's files is no file the server made here.
        if stat.st_nlink > 1 {
            return Err(refused(path, "has other names (hard links)"));
        }
    }
    // O_NONBLOCK only kept a FIFO from blocking the open; regular files ignore it.
    let file = File::from(fd);
    if let FileAccess::Rewrite(mode) = access {
        use std::os::unix::fs::PermissionsExt;
        file.set_len(0)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    Ok(file)
}

/// Replace the server's file `path` below `base` with `contents` (mode `mode`) in one step:
/// written whole to a new file beside it, then renamed over it, so that a reader, or the
/// server after it was killed meanwhile, finds the old contents or the new, never a file
/// cut short (`open_file`'s `Rewrite` empties the file first).
pub fn replace_file(base: &Path, path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not a file path", path.display()),
        ));
    };
    let dir_fd = open_dir(base, dir, DirOwner::Server, true)?;
    // The directory is the server's alone: nobody else makes names in it.
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(format!(
        ".{}-{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let temp = Path::new(&temp);
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd =
        openat(&dir_fd, temp, flags, Mode::from_bits_truncate(mode)).map_err(|e| os(path, e))?;
    let mut file = File::from(fd);
    let written = file
        .set_permissions(std::fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents));
    drop(file);
    match written.and_then(|()| renameat(&dir_fd, temp, &dir_fd, name).map_err(|e| os(path, e))) {
        Ok(()) => Ok(()),
        Err(e) => {
            let _ = nix::unistd::unlinkat(&dir_fd, temp, nix::unistd::UnlinkatFlags::NoRemoveDir);
            Err(e)
        }
    }
}

/// A regular file the job left in one of its directories (its artifacts).
#[derive(Debug, Clone, PartialEq)]
pub struct JobFile {
    /// Its path below the directory, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Seconds since the epoch of its last change.
    pub modified: i64,
}

/// The regular files below the job's directory `dir` (itself below `base`), in name order,
/// at most `max_files` (the second value: whether there were more) and `max_depth`
/// directories deep. Nothing is followed: links, devices, FIFOs and names that are not
/// UTF-8 are left out. A directory not made yet has no files.
pub fn list_job_files(
    base: &Path,
    dir: &Path,
    max_files: usize,
    max_depth: usize,
) -> io::Result<(Vec<JobFile>, bool)> {
    let fd = match open_dir(base, dir, DirOwner::Jobs, false) {
        Ok(fd) => fd,
        Err(e) if is_missing(&e) => return Ok((Vec::new(), false)),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    let mut more = false;
    walk_job_dir(fd, "", dir, max_depth, max_files, &mut files, &mut more)?;
    Ok((files, more))
}

fn walk_job_dir(
    fd: OwnedFd,
    prefix: &str,
    shown: &Path,
    depth_left: usize,
    max_files: usize,
    files: &mut Vec<JobFile>,
    more: &mut bool,
) -> io::Result<()> {
    let mut names: Vec<String> = Vec::new();
    {
        let dup = fd.try_clone()?;
        let mut listing = nix::dir::Dir::from_fd(dup).map_err(|e| os(shown, e))?;
        for entry in listing.iter() {
            let entry = entry.map_err(|e| os(shown, e))?;
            if let Ok(name) = entry.file_name().to_str()
                && name != "."
                && name != ".."
            {
                names.push(name.to_string());
            }
        }
    }
    names.sort();
    for name in names {
        if files.len() >= max_files {
            *more = true;
            return Ok(());
        }
        let Ok(stat) =
            nix::sys::stat::fstatat(&fd, name.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        else {
            continue; // gone since it was listed
        };
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if is_kind(&stat, SFlag::S_IFREG) {
            files.push(JobFile {
                path,
                size: u64::try_from(stat.st_size).unwrap_or(0),
                modified: stat.st_mtime,
            });
        } else if is_kind(&stat, SFlag::S_IFDIR) {
            if depth_left == 0 {
                *more = true;
                continue;
            }
            let child_shown = shown.join(&name);
            let child = open_child_dir(
                &fd,
                std::ffi::OsStr::new(&name),
                &child_shown,
                DirOwner::Jobs,
                false,
            )?;
            walk_job_dir(
                child,
                &path,
                &child_shown,
                depth_left - 1,
                max_files,
                files,
                more,
            )?;
        }
    }
    Ok(())
}

/// Open the job's file `relative` (`/`-separated plain names) below its directory `dir`,
/// to read: no part of the way is a link, the file is a regular file with no other name (a
/// hard link could make another file of the machine look like the job's).
pub fn open_job_file(base: &Path, dir: &Path, relative: &str) -> io::Result<File> {
    let parts: Vec<&str> = relative.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == ".." || p.contains('\0'))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{relative:?}: plain names separated by '/' only"),
        ));
    }
    let mut fd = open_dir(base, dir, DirOwner::Jobs, false)?;
    let mut shown = dir.to_path_buf();
    let (file_name, dirs) = parts
        .split_last()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty path"))?;
    for name in dirs {
        shown.push(name);
        fd = open_child_dir(
            &fd,
            std::ffi::OsStr::new(name),
            &shown,
            DirOwner::Jobs,
            false,
        )?;
    }
    shown.push(file_name);
    let file = openat(
        &fd,
        *file_name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| os(&shown, e))?;
    let stat = fstat(&file).map_err(|e| os(&shown, e))?;
    if !is_kind(&stat, SFlag::S_IFREG) {
        return Err(refused(&shown, "not a regular file"));
    }
    if stat.st_nlink > 1 {
        return Err(refused(&shown, "has other names (hard links)"));
    }
    Ok(File::from(file))
}

/// Whether `e` is a file or directory that is not there (yet).
pub fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn directories_are_made_and_files_opened_below_the_base() {
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        let log = base.join("study-1/4/job.log");
        let mut f = open_file(&base, &log, FileAccess::Append).expect("log");
        f.write_all(b"one\n").expect("write");
        let mut f = open_file(&base, &log, FileAccess::Append).expect("log again");
        f.write_all(b"two\n").expect("write");
        let mut text = String::new();
        open_file(&base, &log, FileAccess::Read)
            .expect("read")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "one\ntwo\n");
        let mode = std::fs::metadata(base.join("study-1/4"))
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o022,
            0,
            "the trial directory is writable by the server only"
        );
    }

    #[test]
    fn a_replaced_file_is_never_seen_cut_short() {
        // A restarted dispatcher reads an empty job handle as a launch whose failure was
        // counted: a server killed between emptying the file and writing it must not
        // leave it empty. A reader racing the writer sees what a restart would.
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        let handle = base.join("study-1/7/job.handle");
        replace_file(&base, &handle, b"local:100", 0o644).expect("first");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (base, handle, stop) = (base.clone(), handle.clone(), stop.clone());
            std::thread::spawn(move || {
                let (mut reads, mut short) = (0u32, 0u32);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut text = String::new();
                    open_file(&base, &handle, FileAccess::Read)
                        .expect("read")
                        .read_to_string(&mut text)
                        .expect("read");
                    reads += 1;
                    if !text.starts_with("local:") || text.len() != 9 {
                        short += 1;
                    }
                }
                (reads, short)
            })
        };
        for i in 0..3000 {
            let text = format!("local:{}", 100 + i % 900);
            replace_file(&base, &handle, text.as_bytes(), 0o644).expect("replace");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (reads, short) = reader.join().expect("reader");
        assert!(reads > 0);
        assert_eq!(short, 0, "{short} of {reads} reads saw a file cut short");
        let names: Vec<_> = std::fs::read_dir(base.join("study-1/7"))
            .expect("dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["job.handle"], "no temporary file is left behind");
    }

    #[test]
    fn links_are_refused_not_followed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        let target = tmp.path().join("target");
        std::fs::write(&target, "secret").expect("target");
        std::fs::create_dir_all(base.join("study-1/4")).expect("dirs");
        std::os::unix::fs::symlink(&target, base.join("study-1/4/job.log")).expect("link");
        let e = open_file(&base, &base.join("study-1/4/job.log"), FileAccess::Append)
            .expect_err("a link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(open_file(&base, &base.join("study-1/4/job.log"), FileAccess::Read).is_err());
        assert_eq!(std::fs::read_to_string(&target).expect("target"), "secret");
        // A linked directory on the way is refused too.
        std::os::unix::fs::symlink(tmp.path(), base.join("study-2")).expect("dir link");
        let e = open_file(&base, &base.join("study-2/target"), FileAccess::Read)
            .expect_err("a linked directory");
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }

    #[test]
    fn a_directory_others_may_write_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        std::fs::create_dir_all(base.join("study-1/4")).expect("dirs");
        std::fs::set_permissions(
            base.join("study-1/4"),
            std::fs::Permissions::from_mode(0o777),
        )
        .expect("chmod");
        let e = open_file(&base, &base.join("study-1/4/job.log"), FileAccess::Append)
            .expect_err("world-writable");
        assert!(e.to_string().contains("writable by other users"), "{e}");
        // The job's own directories may be anyone's; the base itself is the operator's.
        open_dir(&base, &base.join("study-1/4"), DirOwner::Jobs, false).expect("a jobs dir");
    }

    #[test]
    fn hard_links_and_paths_outside_the_base_are_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        let handle = base.join("study-1/4/job.handle");
        open_file(&base, &handle, FileAccess::Rewrite(0o600)).expect("handle");
        std::fs::hard_link(&handle, base.join("study-1/4/other")).expect("hard link");
        assert!(open_file(&base, &handle, FileAccess::Append).is_err());
        assert!(open_file(&base, &tmp.path().join("elsewhere"), FileAccess::Read).is_err());
        assert!(open_file(&base, &base.join("study-1/../x"), FileAccess::Read).is_err());
    }

    #[test]
    fn a_jobs_files_are_listed_and_read_but_never_through_a_link() {
        use std::os::unix::fs::symlink;
        let tmp = tempfile::tempdir().expect("tmp");
        let base = tmp.path().join("runs");
        let model = base.join("study-1/4/model");
        std::fs::create_dir_all(model.join("export/1")).expect("dirs");
        std::fs::write(model.join("model.json"), b"{}").expect("file");
        std::fs::write(model.join("export/1/saved.pb"), b"weights").expect("file");
        let secret = tmp.path().join("secret");
        std::fs::write(&secret, b"not the job's").expect("secret");
        symlink(&secret, model.join("link")).expect("link");
        symlink(tmp.path(), model.join("dirlink")).expect("dir link");
        std::fs::hard_link(&secret, model.join("hard")).expect("hard link");

        let (files, more) = list_job_files(&base, &model, 100, 8).expect("list");
        let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
        // The hard link is a regular file by its look: listed, but refused when read.
        assert_eq!(paths, ["export/1/saved.pb", "hard", "model.json"]);
        assert!(!more);
        assert_eq!(files[0].size, 7);
        let mut text = String::new();
        open_job_file(&base, &model, "export/1/saved.pb")
            .expect("open")
            .read_to_string(&mut text)
            .expect("read");
        assert_eq!(text, "weights");
        for bad in [
            "link",
            "dirlink/secret",
            "hard",
            "../4/job.log",
            "export//1",
            "/etc/passwd",
        ] {
            assert!(
                open_job_file(&base, &model, bad).is_err(),
                "{bad} was opened"
            );
        }
        let (few, more) = list_job_files(&base, &model, 2, 8).expect("list");
        assert_eq!(few.len(), 2);
        assert!(more, "truncated");
        let (shallow, more) = list_job_files(&base, &model, 100, 0).expect("list");
        assert_eq!(shallow.len(), 2, "{shallow:?}");
        assert!(more, "a directory left out");
        let (none, _) =
            list_job_files(&base, &base.join("study-1/5/model"), 100, 8).expect("missing dir");
        assert!(none.is_empty());
    }
}
