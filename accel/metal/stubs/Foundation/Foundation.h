// accel/metal/stubs/Foundation/Foundation.h — NOT Apple's Foundation: the few declarations of it
// that metal_runtime.m uses, with the signatures of Apple's documentation, so that clang can
// check that file on Linux (`make metal-syntax`: -fsyntax-only, Objective-C with ARC). Nothing is
// linked against it. On a Mac the real <Foundation/Foundation.h> is used.
#pragma once

typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef signed char BOOL;
#define YES ((BOOL)1)
#define NO ((BOOL)0)
#define nil ((id)0)
typedef const void* CFTypeRef;

__attribute__((objc_root_class))
@interface NSObject {
    Class isa;
}
+ (instancetype)new;
+ (instancetype)alloc;
- (instancetype)init;
@end

@class NSError;

@interface NSString : NSObject
+ (instancetype)stringWithUTF8String:(const char*)string;
- (const char*)UTF8String;
@end

@interface NSError : NSObject
@property(readonly, copy) NSString* localizedDescription;
@end

@interface NSURL : NSObject
+ (NSURL*)fileURLWithPath:(NSString*)path;
@end

// NSDictionary<KeyType, ObjectType> (a generic class in Apple's header; the parameters are
// left out here)
@interface NSDictionary : NSObject
+ (instancetype)dictionaryWithObject:(id)object forKey:(id)key;
@end

// Apple's Foundation defines these two inline, as ARC's bridging casts: a retained Core
// Foundation reference out of an object, and the object back, released by ARC.
static inline CFTypeRef CFBridgingRetain(id object) { return (__bridge_retained CFTypeRef)object; }
static inline id CFBridgingRelease(CFTypeRef object) { return (__bridge_transfer id)object; }
