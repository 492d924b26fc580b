// ane_private.m - the private in-memory Apple Neural Engine API behind a small C interface, for
// accel/ane/private.py (ctypes). macOS only, opt-in: `make ane-private`.
//
// UNRUN: written without a Mac (no macOS machine was available); reviewed against Apple's public
// documentation for IOSurface and Foundation (accel/ane/README.md lists what was checked) and
// against the anchor's description of the private classes, which Apple does not document and may
// change in any macOS release. PrivateANERuntime trusts a kernel only after its outputs match
// the Core ML path's.
//
//   ane_init(err)                          dlopen AppleNeuralEngine.framework, find the classes
//   ane_compile(mil, weights, sizes, err)  MIL text + one BLOBFILE -> a loaded model with one
//                                          IOSurface per input and output (fp16 bytes)
//   ane_run(kernel, inputs, outputs, err)  copy in, evaluate one request, copy out
//   ane_free(kernel)                       unload, release
// Every function returns 0 / NULL on failure with a one-line reason in err.
#import <Foundation/Foundation.h>
#import <IOSurface/IOSurface.h>
#import <dlfcn.h>
#import <objc/message.h>
#include <string.h>

static Class g_descriptor, g_model, g_request, g_surface_object;

typedef struct {
    void *model;              // _ANEInMemoryModel, loaded (CFBridgingRetain'ed: ARC keeps no
                              // objects in C structs)
    int n_in, n_out;
    IOSurfaceRef surfaces[64];
    size_t bytes[64];
    void *request;            // _ANERequest over the surfaces (retained likewise)
} Kernel;

void ane_free(void *handle);

static void fail(char *err, size_t n, NSString *why) {
    snprintf(err, n, "%s", why.UTF8String);
}

int ane_init(char *err, size_t n) {
    if (g_descriptor) return 1;
    if (!dlopen("/System/Library/PrivateFrameworks/AppleNeuralEngine.framework/AppleNeuralEngine",
                RTLD_NOW)) {
        fail(err, n, [NSString stringWithFormat:@"dlopen AppleNeuralEngine: %s", dlerror()]);
        return 0;
    }
    g_descriptor = NSClassFromString(@"_ANEInMemoryModelDescriptor");
    g_model = NSClassFromString(@"_ANEInMemoryModel");
    g_request = NSClassFromString(@"_ANERequest");
    g_surface_object = NSClassFromString(@"_ANEIOSurfaceObject");
    if (!g_descriptor || !g_model || !g_request || !g_surface_object) {
        g_descriptor = nil;
        fail(err, n, @"the private ANE classes are missing (another macOS version?)");
        return 0;
    }
    return 1;
}

// A linear buffer of `bytes`: width = bytes, one byte per element, one row (IOSurfaceCreate's
// documented properties; the surface is locked around every CPU access below).
static IOSurfaceRef make_surface(size_t bytes) {
    NSDictionary *props = @{(id)kIOSurfaceWidth: @(bytes), (id)kIOSurfaceHeight: @1,
                            (id)kIOSurfaceBytesPerElement: @1, (id)kIOSurfaceBytesPerRow: @(bytes),
                            (id)kIOSurfaceAllocSize: @(bytes), (id)kIOSurfacePixelFormat: @0};
    return IOSurfaceCreate((__bridge CFDictionaryRef)props);
}

void *ane_compile(const char *mil, size_t mil_len, const void *blob, size_t blob_len,
                  int n_in, const size_t *in_bytes, int n_out, const size_t *out_bytes,
                  char *err, size_t n) {
    @autoreleasepool {
        if (!ane_init(err, n)) return NULL;
        if (n_in + n_out > 64) { fail(err, n, @"more than 64 inputs and outputs"); return NULL; }
        NSData *text = [NSData dataWithBytes:mil length:mil_len];
        NSDictionary *weights = @{@"@model_path/weights/weight.bin":
                                      @{@"offset": @0, @"data": [NSData dataWithBytes:blob
                                                                              length:blob_len]}};
        id desc = ((id (*)(Class, SEL, id, id, id))objc_msgSend)(
            g_descriptor, @selector(modelWithMILText:weights:optionsPlist:), text, weights, nil);
        id model = desc ? ((id (*)(Class, SEL, id))objc_msgSend)(
                              g_model, @selector(inMemoryModelWithDescriptor:), desc) : nil;
        if (!model) { fail(err, n, @"the ANE refused the MIL text (descriptor)"); return NULL; }
        // the compiler reads model.mil and weights/ from the model's own directory
        NSString *hex = ((id (*)(id, SEL))objc_msgSend)(model, @selector(hexStringIdentifier));
        NSString *dir = [NSTemporaryDirectory() stringByAppendingPathComponent:hex];
        NSFileManager *fm = NSFileManager.defaultManager;
        [fm createDirectoryAtPath:[dir stringByAppendingPathComponent:@"weights"]
            withIntermediateDirectories:YES attributes:nil error:nil];
        [text writeToFile:[dir stringByAppendingPathComponent:@"model.mil"] atomically:YES];
        [weights[@"@model_path/weights/weight.bin"][@"data"]
            writeToFile:[dir stringByAppendingPathComponent:@"weights/weight.bin"] atomically:YES];
        NSError *e = nil;
        BOOL ok = ((BOOL (*)(id, SEL, unsigned, id, NSError **))objc_msgSend)(
            model, @selector(compileWithQoS:options:error:), 21, @{}, &e);
        if (ok) ok = ((BOOL (*)(id, SEL, unsigned, id, NSError **))objc_msgSend)(
            model, @selector(loadWithQoS:options:error:), 21, @{}, &e);
        if (!ok) {
            fail(err, n, [NSString stringWithFormat:@"ANE compile/load failed: %@",
                          e.localizedDescription ?: @"no reason given"]);
            return NULL;
        }
        Kernel *k = calloc(1, sizeof(Kernel));
        k->model = (void *)CFBridgingRetain(model);
        k->n_in = n_in;
        k->n_out = n_out;
        NSMutableArray *ins = [NSMutableArray array], *outs = [NSMutableArray array];
        NSMutableArray *in_idx = [NSMutableArray array], *out_idx = [NSMutableArray array];
        for (int i = 0; i < n_in + n_out; i++) {
            k->bytes[i] = i < n_in ? in_bytes[i] : out_bytes[i - n_in];
            k->surfaces[i] = make_surface(k->bytes[i]);
            if (!k->surfaces[i]) {
                fail(err, n, @"IOSurfaceCreate failed");
                ane_free(k);
                return NULL;
            }
            id obj = ((id (*)(Class, SEL, IOSurfaceRef))objc_msgSend)(
                g_surface_object, @selector(objectWithIOSurface:), k->surfaces[i]);
            [(i < n_in ? ins : outs) addObject:obj];
            [(i < n_in ? in_idx : out_idx) addObject:@(i < n_in ? i : i - n_in)];
        }
        id request = ((id (*)(Class, SEL, id, id, id, id, id, id, id))objc_msgSend)(
            g_request,
            @selector(requestWithInputs:inputIndices:outputs:outputIndices:weightsBuffer:perfStats:procedureIndex:),
            ins, in_idx, outs, out_idx, nil, nil, @0);
        if (!request) {
            fail(err, n, @"_ANERequest refused the surfaces");
            ane_free(k);
            return NULL;
        }
        k->request = (void *)CFBridgingRetain(request);
        return k;
    }
}

int ane_run(void *handle, const void **inputs, void **outputs, char *err, size_t n) {
    @autoreleasepool {
        Kernel *k = handle;
        for (int i = 0; i < k->n_in; i++) {
            IOSurfaceLock(k->surfaces[i], 0, NULL);
            memcpy(IOSurfaceGetBaseAddress(k->surfaces[i]), inputs[i], k->bytes[i]);
            IOSurfaceUnlock(k->surfaces[i], 0, NULL);
        }
        NSError *e = nil;
        BOOL ok = ((BOOL (*)(id, SEL, unsigned, id, id, NSError **))objc_msgSend)(
            (__bridge id)k->model, @selector(evaluateWithQoS:options:request:error:), 21, @{},
            (__bridge id)k->request, &e);
        if (!ok) {
            fail(err, n, [NSString stringWithFormat:@"ANE evaluate failed: %@",
                          e.localizedDescription ?: @"no reason given"]);
            return 0;
        }
        for (int i = 0; i < k->n_out; i++) {
            IOSurfaceRef s = k->surfaces[k->n_in + i];
            IOSurfaceLock(s, kIOSurfaceLockReadOnly, NULL);
            memcpy(outputs[i], IOSurfaceGetBaseAddress(s), k->bytes[k->n_in + i]);
            IOSurfaceUnlock(s, kIOSurfaceLockReadOnly, NULL);
        }
        return 1;
    }
}

void ane_free(void *handle) {
    @autoreleasepool {
        Kernel *k = handle;
        if (!k) return;
        NSError *e = nil;
        ((BOOL (*)(id, SEL, unsigned, NSError **))objc_msgSend)(
            (__bridge id)k->model, @selector(unloadWithQoS:error:), 21, &e);
        for (int i = 0; i < k->n_in + k->n_out; i++)
            if (k->surfaces[i]) CFRelease(k->surfaces[i]);
        CFBridgingRelease(k->model);
        if (k->request) CFBridgingRelease(k->request);
        free(k);
    }
}
