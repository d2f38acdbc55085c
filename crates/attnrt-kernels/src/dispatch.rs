//! The attention entry points: each call is validated once ([`Problem::check`]) and sent to the
//! flash kernel or the decode path as its [`KernelSet`] says.

use crate::cache::{append_rows, CacheAppend};
use crate::error::KernelError;
use crate::kernel_set::KernelSet;
use crate::problem::{AttentionParams, Mask, Problem};
use crate::view::{View4, ViewMut4};
use crate::{decode, flash};

/// Fused attention with the kernels of `kernels`: the decode path for a few queries (its
/// route, by default `Lq ≤ 4`), else the flash kernel, on its ISA.
///
/// Shapes: Q `[B, Hq, Lq, D]`, K `[B, Hkv, Lk, D]`, V `[B, Hkv, Lk, Dv]`, out `[B, Hq, Lq, Dv]`,
/// `Hq % Hkv == 0` (GQA: q-head `h` uses kv-head `h / (Hq/Hkv)`). Runs on the current rayon pool
/// (wrap the call in `pool.install(..)` to choose the threads). Scratch memory is one buffer
/// per pool thread of [`crate::scratch_bytes`] (≤ 0.6 MB at D = 64–128), independent of the
/// sequence lengths: no `Lq×Lk` score matrix is ever formed. Each thread keeps its buffer for
/// the next call with the same head sizes. The decode path allocates per call its partial
/// results, `splits·B·Hq·Lq·(Dv + 2)` floats, and per task a `Hq/Hkv·Lq × (D + Dv + 32)`
/// scratch.
pub fn attention(
    kernels: &KernelSet,
    q: &View4,
    k: &View4,
    v: &View4,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    let problem = Problem::check(q, k, Some(v), mask, Some(out))?;
    let threads = kernels.threads();
    if kernels.decode().serves(&problem) {
        decode::run(
            kernels.decode(),
            threads,
            &problem,
            q,
            k,
            v,
            mask,
            params,
            out,
        );
    } else {
        flash::run(
            kernels.flash(),
            threads,
            &problem,
            q,
            k,
            v,
            mask,
            params,
            out,
        );
    }
    Ok(())
}

/// [`attention`] over `present = past ++ current`, building `present`'s past rows in the
/// same pass (see [`CacheAppend`]). Q `[B, Hq, Lq, D]`, the mask broadcast to
/// `[B, Hq, Lq, P + L]`, out `[B, Hq, Lq, Dv]`. A call the decode path does not serve copies
/// the past first, then runs the flash kernel.
pub fn attention_appending(
    kernels: &KernelSet,
    q: &View4,
    cache: CacheAppend,
    mask: &Mask,
    params: &AttentionParams,
    out: &mut ViewMut4,
) -> Result<(), KernelError> {
    let (kd, vd) = cache.present_dims()?;
    let problem = {
        let k = View4::contiguous(&*cache.present_key, kd)?;
        let v = View4::contiguous(&*cache.present_value, vd)?;
        Problem::check(q, &k, Some(&v), mask, Some(out))?
    };
    let threads = kernels.threads();
    if kernels.decode().serves(&problem) {
        decode::run_appending(
            kernels.decode(),
            threads,
            &problem,
            q,
            cache,
            mask,
            params,
            out,
        );
        return Ok(());
    }
    append_rows(threads, cache.past_key, cache.present_key, cache.total, 0);
    append_rows(
        threads,
        cache.past_value,
        cache.present_value,
        cache.total,
        0,
    );
    let k = View4::contiguous(&*cache.present_key, kd)?;
    let v = View4::contiguous(&*cache.present_value, vd)?;
    flash::run(
        kernels.flash(),
        threads,
        &problem,
        q,
        &k,
        &v,
        mask,
        params,
        out,
    );
    Ok(())
}
