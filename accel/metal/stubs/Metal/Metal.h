// accel/metal/stubs/Metal/Metal.h — NOT Apple's Metal framework: the declarations of it that
// metal_runtime.m uses, with the signatures of Apple's documentation (accel/metal/README.md's
// table), so that clang can check that file on Linux (`make metal-syntax`). Enum values are
// placeholders except where noted: nothing runs against this header. On a Mac the real
// <Metal/Metal.h> is used.
#pragma once
#import <Foundation/Foundation.h>

typedef struct {
    NSUInteger width, height, depth;
} MTLSize;
static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
    MTLSize size = {width, height, depth};
    return size;
}

typedef NSInteger MTLGPUFamily;
enum { MTLGPUFamilyApple4 = 1004, MTLGPUFamilyApple7 = 1007, MTLGPUFamilyMac2 = 2002 };
typedef NSUInteger MTLResourceOptions;
enum { MTLResourceStorageModeShared = 0 };
typedef NSUInteger MTLCommandBufferStatus;
enum { MTLCommandBufferStatusError = 5 };

typedef NSUInteger MTLLanguageVersion;
enum { MTLLanguageVersion3_1 = (3 << 16) + 1 };   // Apple's value: (major << 16) + minor

@interface MTLCompileOptions : NSObject
@property(readwrite, copy, nonatomic) NSDictionary* preprocessorMacros;   // NSDictionary<NSString*, NSObject*>*
@property(readwrite, nonatomic) MTLLanguageVersion languageVersion;
@end

@protocol MTLFunction
@end

@protocol MTLLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@protocol MTLComputePipelineState
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@end

@protocol MTLBuffer
- (void*)contents;
@end

@protocol MTLCommandEncoder
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLCommandBuffer
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
@end

@protocol MTLCommandQueue
- (id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice
@property(readonly) NSString* name;
- (BOOL)supportsFamily:(MTLGPUFamily)gpuFamily;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLLibrary>)newLibraryWithURL:(NSURL*)url error:(NSError**)error;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)function error:(NSError**)error;
@end

id<MTLDevice> MTLCreateSystemDefaultDevice(void);
