//! An interrupt while an output file is written leaves no file behind.
//!
//! The writers of [`kda::io`] write into a temporary file beside the target
//! ([`kda::io::temporary_beside`]) and rename it over the target only when it is complete; an
//! error removes it. A signal that ends the process (Ctrl-C's `SIGINT`, `SIGTERM`, `SIGHUP`)
//! runs no destructor, so [`RemoveOnInterrupt`] covers that case: while it is alive, those signals
//! remove its path and then end the process as they would have (the default disposition,
//! re-raised: the exit status still says "killed by SIGINT").
//!
//! ```no_run
//! use kda_cli::interrupt::RemoveOnInterrupt;
//! # let (path, out, dims): (&std::path::Path, kda::Outputs, kda::Dims) = todo!();
//! let _armed = RemoveOnInterrupt::arm(&kda::io::temporary_beside(path));
//! kda::io::write_outputs(path, &out, &dims)?;
//! # Ok::<(), kda::KdaError>(())
//! ```
//!
//! On Unix the handlers are installed by the first guard and stay (a signal while no guard is
//! armed only re-raises it with the default disposition); a signal the process ignores (`nohup`'s
//! `SIGHUP`) stays ignored. Elsewhere the guard does nothing.

use std::path::Path;

/// While alive, `SIGINT`, `SIGTERM` and `SIGHUP` remove the path it was armed with before they end
/// the process. One guard is armed at a time (the CLI writes one file at a time).
#[must_use = "the path is removed on an interrupt only while the guard is alive"]
#[derive(Debug)]
pub struct RemoveOnInterrupt {
    #[cfg(unix)]
    _armed: Option<unix::Armed>,
}

impl RemoveOnInterrupt {
    /// Removes `path` if the process is interrupted before the guard is dropped.
    ///
    /// A path with a NUL byte cannot be passed to the system and arms nothing.
    ///
    /// # Panics
    ///
    /// If another guard is armed.
    pub fn arm(path: &Path) -> Self {
        #[cfg(unix)]
        return RemoveOnInterrupt { _armed: unix::Armed::new(path) };
        #[cfg(not(unix))]
        {
            unsafe { libc::unlink(path) };
            RemoveOnInterrupt {}
        }
    }
}

#[cfg(unix)]
mod unix {
    use libc::{c_char, c_int};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::ptr;
    use std::sync::Once;
    use std::sync::atomic::{AtomicPtr, Ordering};

    /// The signals that end the process and remove the armed path first.
    const SIGNALS: [c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    /// The armed path as a NUL-terminated string made by `CString::into_raw`, or null.
    ///
    /// Whoever swaps a pointer out owns it: the handler takes it with `swap` (and the process
    /// ends), the guard takes it back with `compare_exchange`; so the guard frees a string only
    /// when no handler has it, and a handler reads only a string no guard can free.
    static ARMED: AtomicPtr<c_char> = AtomicPtr::new(ptr::null_mut());

    static INSTALL: Once = Once::new();

    /// The armed path's registration; dropping it disarms.
    #[derive(Debug)]
    pub(super) struct Armed(*mut c_char);

    impl Armed {
        pub(super) fn new(path: &Path) -> Option<Armed> {
            let path = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
            INSTALL.call_once(install_handlers);
            if let Err(other) = ARMED.compare_exchange(ptr::null_mut(), path, Ordering::SeqCst, Ordering::SeqCst) {
                free(path);
                panic!(
                    "a path is already armed to be removed on an interrupt ({other:?}); one output is written at a time"
                );
            }
            Some(Armed(path))
        }
    }

    impl Drop for Armed {
        fn drop(&mut self) {
            // A failed exchange means a handler took the path: it is ending the process and still
            // reads the string, so it is left alone.
            if ARMED.compare_exchange(self.0, ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                free(self.0);
            }
        }
    }

    /// Frees a string made by `CString::into_raw` that no handler can reach.
    fn free(path: *mut c_char) {
        // SAFETY: `path` came from `CString::into_raw` and is not in `ARMED` (the caller owns it),
        // so nothing else reads or frees it.
        drop(unsafe { CString::from_raw(path) });
    }

    /// Installs `on_signal` for each of `SIGNALS` the process does not ignore.
    fn install_handlers() {
        for signal in SIGNALS {
            if disposition(signal) != libc::SIG_IGN {
                set_handler(signal, on_signal as extern "C" fn(c_int) as libc::sighandler_t);
            }
        }
    }

    /// The current handler of `signal` (`SIG_DFL`, `SIG_IGN` or a function).
    fn disposition(signal: c_int) -> libc::sighandler_t {
        // SAFETY: an all-zero `sigaction` is a valid value of the plain C struct, and `sigaction`
        // with a null new action only reads the current one into `old`.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, ptr::null(), &mut old);
            old.sa_sigaction
        }
    }

    /// Sets `signal`'s handler to `handler`, with the other signals of `SIGNALS` blocked while it
    /// runs. Async-signal-safe (`sigemptyset`, `sigaddset` and `sigaction` are).
    fn set_handler(signal: c_int, handler: libc::sighandler_t) {
        // SAFETY: the struct is fully initialised (zeroed, an empty then filled mask, the handler)
        // before `sigaction` reads it; `handler` is `SIG_DFL` or `on_signal`, which is
        // async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            libc::sigemptyset(&mut action.sa_mask);
            for other in SIGNALS {
                libc::sigaddset(&mut action.sa_mask, other);
            }
            action.sa_sigaction = handler;
            action.sa_flags = libc::SA_RESTART;
            libc::sigaction(signal, &action, ptr::null_mut());
        }
    }

    /// The handler: removes the armed path, if any, then restores the default disposition and
    /// raises `signal` again, which ends the process once the handler returns (`signal` is
    /// blocked until then). Only async-signal-safe calls: an atomic swap, `unlink`, `sigaction`,
    /// `raise`.
    extern "C" fn on_signal(signal: c_int) {
        let path = ARMED.swap(ptr::null_mut(), Ordering::SeqCst);
        if !path.is_null() {
            unlink(path);
        }
        set_handler(signal, libc::SIG_DFL);
        raise(signal);
    }

    /// Removes the file at `path`, ignoring a failure (it may not exist yet, or no longer).
    fn unlink(path: *const c_char) {
        // SAFETY: `path` is a NUL-terminated string from `CString::into_raw` that this handler
        // took out of `ARMED`, so no guard frees it.
        unsafe { libc::unlink(path) };
    }

    /// Sends `signal` to the calling thread.
    pub(super) fn raise(signal: c_int) {
        // SAFETY: `raise` has no memory preconditions.
        unsafe { libc::raise(signal) };
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::RemoveOnInterrupt;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// In the child: the directory to write in.
    const CHILD: &str = "KDA_INTERRUPT_CHILD";

    /// Runs test `name` of this module again in a child process told to write in a fresh
    /// directory; returns the signal the child died of and the files it left there.
    fn in_child(name: &str) -> (Option<i32>, Vec<String>) {
        let dir = std::env::temp_dir().join(format!("kda-interrupt-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // libtest names tests by their path without the crate.
        let module = module_path!().split_once("::").unwrap().1;
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args(["--exact", &format!("{module}::{name}"), "--nocapture", "--test-threads", "1"]).env(CHILD, &dir);
        // The child starts with the signals' default actions, whatever this process inherited
        // (a shell's background job ignores SIGINT, and the guard keeps an ignored signal
        // ignored): what a program run from a terminal gets.
        // SAFETY: between fork and exec the closure only calls `signal`, which is
        // async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(|| {
                for signal in [libc::SIGINT, libc::SIGTERM] {
                    libc::signal(signal, libc::SIG_DFL);
                }
                Ok(())
            })
        };
        let child = command.output().unwrap();
        // Shown when the test fails.
        println!("{}{}", String::from_utf8_lossy(&child.stdout), String::from_utf8_lossy(&child.stderr));
        let left = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        (child.status.signal(), left)
    }

    /// In the child: the temporary file of a write of `dir/out.safetensors` in progress, part
    /// written.
    fn partial_temporary(dir: &Path) -> PathBuf {
        let temp = kda::io::temporary_beside(&dir.join("out.safetensors"));
        std::fs::write(&temp, b"part of a safetensors file").unwrap();
        temp
    }

    #[test]
    fn an_interrupt_during_a_write_leaves_no_temporary_file() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let temp = partial_temporary(Path::new(&dir));
            let _armed = RemoveOnInterrupt::arm(&temp);
            super::unix::raise(libc::SIGINT);
            unreachable!("SIGINT ends the process");
        }
        let (signal, left) = in_child("an_interrupt_during_a_write_leaves_no_temporary_file");
        assert_eq!(signal, Some(libc::SIGINT), "the child dies of SIGINT, as without the guard");
        assert_eq!(left, Vec::<String>::new(), "the interrupted write leaves these behind");
    }

    #[test]
    fn a_signal_after_the_write_leaves_other_files_alone() {
        if let Some(dir) = std::env::var_os(CHILD) {
            let temp = partial_temporary(Path::new(&dir));
            drop(RemoveOnInterrupt::arm(&temp));
            super::unix::raise(libc::SIGTERM);
            unreachable!("SIGTERM ends the process");
        }
        let (signal, left) = in_child("a_signal_after_the_write_leaves_other_files_alone");
        assert_eq!(signal, Some(libc::SIGTERM), "the child dies of SIGTERM");
        assert_eq!(left.len(), 1, "the file is removed though its guard was dropped: {left:?}");
        assert!(left[0].starts_with(".out.safetensors.kda-"), "{left:?}");
    }
}
