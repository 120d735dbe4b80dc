/* The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), version 1.x: the structs a
 * producer and a consumer of DLPack capsules share, declared here from the public specification
 * (only what kiln uses: CPU tensors, plain dtypes). */
#ifndef KILN_DLPACK_H
#define KILN_DLPACK_H

#include <stdint.h>

/* The version kiln produces and understands: a different major version changes the layout of
 * DLManagedTensorVersioned beyond its `version`, `manager_ctx` and `deleter`; a newer minor version
 * only adds enum values (devices, dtypes), which kiln refuses when it meets them. */
#define KILN_DLPACK_MAJOR 1
#define KILN_DLPACK_MINOR 1

/* DLManagedTensorVersioned.flags */
#define KILN_DLPACK_FLAG_READ_ONLY ((uint64_t)1 << 0) /* the consumer must not write the data */
#define KILN_DLPACK_FLAG_IS_COPIED ((uint64_t)1 << 1) /* the producer made a copy for this export */

/* The capsule names of the Python protocol: a producer names its capsule "dltensor" (legacy
 * DLManagedTensor) or "dltensor_versioned"; the consumer that takes the tensor over renames it
 * to the "used_" name, so that the capsule's destructor no longer calls the deleter. */
#define KILN_DLPACK_NAME "dltensor"
#define KILN_DLPACK_NAME_USED "used_dltensor"
#define KILN_DLPACK_NAME_VERSIONED "dltensor_versioned"
#define KILN_DLPACK_NAME_VERSIONED_USED "used_dltensor_versioned"

typedef enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3,
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
} DLDeviceType;

typedef struct {
    DLDeviceType device_type;
    int32_t device_id;
} DLDevice;

typedef enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
} DLDataTypeCode;

typedef struct {
    uint8_t code;   /* a DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes; /* 1 for scalars */
} DLDataType;

typedef struct {
    void *data;           /* the element at index 0 is at data + byte_offset */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;     /* in elements; NULL: compact row-major (not allowed from 1.2 on for ndim > 0) */
    uint64_t byte_offset;
} DLTensor;

/* The legacy form (capsule "dltensor"): no version, no flags. */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/* The versioned form (capsule "dltensor_versioned"). Everything before dl_tensor keeps its place
 * across major versions, so a consumer can always call the deleter. */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

#endif
