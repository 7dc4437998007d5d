//! Cooperative cancellation, for a caller that stopped waiting (the service answers a
//! suggestion that missed its time budget without the model).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    static FLAG: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Run `f` with `flag` as this thread's cancellation flag.
///
/// A designer runs on its caller's thread; this lends that thread a flag, and the long loops
/// (the GP's likelihood evaluations, the acquisition search, a batch's suggestions) check it
/// between steps and wind down once it is set. Without a flag, or while it is unset, nothing
/// changes: the same input and seed give the same suggestions. Once set, what the designer
/// returns is meant to be thrown away.
pub fn with_cancel<T>(flag: Arc<AtomicBool>, f: impl FnOnce() -> T) -> T {
    /// Puts the previous flag back, even if `f` panics.
    struct Restore(Option<Arc<AtomicBool>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            FLAG.with(|c| *c.borrow_mut() = previous);
        }
    }
    let _restore = Restore(FLAG.with(|c| c.replace(Some(flag))));
    f()
}

/// Whether the caller of the running designer has given up on it.
pub fn requested() -> bool {
    FLAG.with(|c| {
        c.borrow()
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_seen_inside_only() {
        let flag = Arc::new(AtomicBool::new(false));
        assert!(!requested());
        with_cancel(flag.clone(), || {
            assert!(!requested());
            flag.store(true, Ordering::Relaxed);
            assert!(requested());
        });
        assert!(!requested());
    }
}
