//! The context opens an adapter (lavapipe in CI) with the adapter's own limits.

#[test]
fn context_opens_with_adapter_limits() {
    flint_gpu::gpu_test!(ctx => {
        assert!(ctx.limits.max_storage_buffer_binding_size >= 128 << 20);
        assert!(ctx.max_binding() <= ctx.limits.max_storage_buffer_binding_size);
        assert!(!ctx.adapter_name().is_empty());
        ctx.check().unwrap();
    });
}
