// Clang thread-safety annotations (-Wthread-safety), as macros that vanish elsewhere.
//
// They let the compiler check the locking discipline that class comments state in words:
// a member marked GRADWIRE_GUARDED_BY(mutex_) may only be touched while mutex_ is held.
// Use them with gradwire::Mutex and gradwire::MutexLock (<gradwire/core/mutex.h>), which
// carry the capability attributes that std::mutex lacks in libstdc++.
//
// Thread-safety: compile-time only; no run-time effect.
// Errors: none at run time; clang reports violations as -Wthread-safety warnings.
//
// Example:
//   class Counter {
//     void add() GRADWIRE_EXCLUDES(mutex_) { MutexLock lock(mutex_); ++count_; }
//     Mutex mutex_;
//     int count_ GRADWIRE_GUARDED_BY(mutex_) = 0;
//   };
#pragma once

#if defined(__clang__)
#define GRADWIRE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GRADWIRE_THREAD_ANNOTATION(x)
#endif

#define GRADWIRE_CAPABILITY(name) GRADWIRE_THREAD_ANNOTATION(capability(name))
#define GRADWIRE_SCOPED_CAPABILITY GRADWIRE_THREAD_ANNOTATION(scoped_lockable)
#define GRADWIRE_GUARDED_BY(x) GRADWIRE_THREAD_ANNOTATION(guarded_by(x))
#define GRADWIRE_PT_GUARDED_BY(x) GRADWIRE_THREAD_ANNOTATION(pt_guarded_by(x))
#define GRADWIRE_REQUIRES(...) GRADWIRE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define GRADWIRE_EXCLUDES(...) GRADWIRE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define GRADWIRE_ACQUIRE(...) GRADWIRE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define GRADWIRE_RELEASE(...) GRADWIRE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define GRADWIRE_TRY_ACQUIRE(...) GRADWIRE_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define GRADWIRE_RETURN_CAPABILITY(x) GRADWIRE_THREAD_ANNOTATION(lock_returned(x))
#define GRADWIRE_NO_THREAD_SAFETY_ANALYSIS GRADWIRE_THREAD_ANNOTATION(no_thread_safety_analysis)
