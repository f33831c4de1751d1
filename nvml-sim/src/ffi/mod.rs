//! The exported C symbols, with the exact signatures of `nvml.h`: each is declared once through
//! [`nvml_fn!`], which also checks its signature at compile time against the function-pointer
//! type of `nvml_wrapper_sys::bindings::NvmlLib` (or, for the few entry points `NvmlLib` lacks,
//! against a prototype written from `nvml.h`). Each function runs the common checks
//! of [`crate::runtime`], validates its pointers (NULL is `NVML_ERROR_INVALID_ARGUMENT`), and
//! computes its answer from the scenario and the clock. No call unwinds into C: a panic becomes
//! `NVML_ERROR_UNKNOWN`.
//!
//! # Safety
//!
//! These are C entry points; the caller upholds NVML's contract: pointers are NULL or valid for
//! writes of the documented type (and, for arrays, of the count given), strings are
//! NUL-terminated, and handles come from this library.

#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::os::raw::{c_char, c_uint};

use crate::abi::{self, Ret};

pub mod device;
pub mod events;
pub mod field_values;
pub mod gpm;
pub mod health;
pub mod mig;
pub mod nvlink;
pub mod process;
pub mod system;

/// Runs a call body returning `Result<(), Ret>`, mapping it (and any panic) to a return code.
macro_rules! nvml_body {
    ($body:block) => {{
        match ::std::panic::catch_unwind(::std::panic::AssertUnwindSafe(
            || -> ::std::result::Result<(), $crate::abi::Ret> { $body },
        )) {
            Ok(Ok(())) => $crate::abi::SUCCESS,
            Ok(Err(code)) => code,
            Err(_) => $crate::abi::UNKNOWN,
        }
    }};
}
pub(crate) use nvml_body;

/// Declares one exported NVML entry point, once: the `#[no_mangle] extern "C"` function, its
/// body run through [`nvml_body!`] with `|api|` bound to its [`Api`](crate::api::Api) entry, and
/// a compile-time check of its signature. The check passes the function where the matching
/// `NvmlLib` field of `nvml-wrapper-sys` (generated from `nvml.h`) is expected, so a wrong
/// parameter or return type fails the build. An entry point `NvmlLib` lacks (an older, shorter
/// struct version; a legacy name it only declares behind its `legacy-functions` feature) names
/// its `nvml.h` prototype after `as`.
macro_rules! nvml_fn {
    (
        $(#[$meta:meta])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(as $proto:ty)? $(|$api:ident|)? $body:block
    ) => {
        $(#[$meta])*
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $crate::abi::Ret {
            $crate::ffi::nvml_body!({
                $(let $api = $crate::api::Api::$name;)?
                $body
            })
        }
        $crate::ffi::check_signature!($name $(as $proto)?);
    };
}
pub(crate) use nvml_fn;

/// The signature check of [`nvml_fn!`], also used on its own by the few entry points that do not
/// fit its shape (`nvmlInit`, `nvmlErrorString`).
macro_rules! check_signature {
    ($name:ident) => {
        const _: fn(&::nvml_wrapper_sys::bindings::NvmlLib) =
            |lib| $crate::ffi::same_signature(&lib.$name, $name);
    };
    ($name:ident as $proto:ty) => {
        const _: $proto = $name;
    };
}
pub(crate) use check_signature;

/// Type-checks only: `f` must coerce to the function-pointer type `NvmlLib` holds for it.
pub(crate) fn same_signature<F, E>(_: &Result<F, E>, _f: F) {}

/// The output behind a pointer, or `INVALID_ARGUMENT` for NULL.
#[inline]
pub(crate) unsafe fn out<'a, T>(p: *mut T) -> Result<&'a mut T, Ret> {
    p.as_mut().ok_or(abi::INVALID_ARGUMENT)
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes (`INSUFFICIENT_SIZE` if too small).
#[inline]
pub(crate) unsafe fn write_str(dst: *mut c_char, len: c_uint, s: &str) -> Result<(), Ret> {
    if dst.is_null() {
        return Err(abi::INVALID_ARGUMENT);
    }
    let b = s.as_bytes();
    if (len as usize) < b.len() + 1 {
        return Err(abi::INSUFFICIENT_SIZE);
    }
    std::ptr::copy_nonoverlapping(b.as_ptr(), dst.cast::<u8>(), b.len());
    *dst.add(b.len()) = 0;
    Ok(())
}

/// Copies a fixed-size C string field (`busId` etc.), always NUL-terminated.
#[inline]
pub(crate) fn fill_field(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    for d in dst[n..].iter_mut() {
        *d = 0;
    }
}

/// Reads a caller's C string (NULL is `INVALID_ARGUMENT`; invalid UTF-8 matches nothing).
#[inline]
pub(crate) unsafe fn read_str<'a>(p: *const c_char) -> Result<&'a str, Ret> {
    if p.is_null() {
        return Err(abi::INVALID_ARGUMENT);
    }
    Ok(std::ffi::CStr::from_ptr(p).to_str().unwrap_or(""))
}

/// NVML's `nvmlEnableState_t` from a bool.
#[inline]
pub(crate) fn enable_state(on: bool) -> abi::nvmlEnableState_t {
    if on {
        abi::nvmlEnableState_enum_NVML_FEATURE_ENABLED
    } else {
        abi::nvmlEnableState_enum_NVML_FEATURE_DISABLED
    }
}

/// A signal value as an unsigned NVML integer: rounded, clamped to `[0, max]`.
#[inline]
pub(crate) fn to_u32(v: f64, max: u32) -> u32 {
    v.round().clamp(0.0, max as f64) as u32
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hardware_tests;
