/* A batch of JPEGs decoded by nvImageCodec's C API in one call, with no Python per
 * image (packer/imaging/nvbatch.py compiles and loads it; see there for why).
 *
 * nvb_open   makes an instance and a decoder (the hardware engines, the CUDA decoder,
 *            both, or the CPU), with room for `cap` images.
 * nvb_decode takes n byte spans (pointers + lengths), each image's expected height and
 *            width, optionally a box per image (top, left, height, width: only the box is
 *            decoded, and the output is the box's size), and the output layout (a buffer,
 *            each image's byte offset into it and its row pitch: planar RGB, plane k at
 *            offset + k * out_h * pitch). Every header is
 *            parsed first and checked against the expected size; only when all agree is
 *            anything decoded, so a file cannot make the decoder write past its slot.
 *            status[i]: 1 decoded; 0 not decoded; -1 header unreadable; -2 size differs
 *            (got_hw[i] holds what the header says); -3 decode failed.
 *            Returns 0, or a negative nvImageCodec call failure (-100 - its status).
 * nvb_pooled 1 where the pools below are in use (nvb_pools_*: the pools alone, tested on
 *            the CPU against a stand-in runtime).
 * nvb_close  frees everything.
 *
 * Memory (nvb_open's `cudart`): given the path of the CUDA runtime the process already
 * loaded, nvImageCodec's device and pinned allocations go through pools here, as DALI's
 * do, instead of its default cudaMalloc / cudaHostAlloc on each growth: device memory
 * stream-ordered (cudaMallocAsync on the device's default pool, kept once freed), pinned
 * blocks kept and handed out again once the stream that freed them is past them (an
 * event). nvjpeg rounds each request up to `dev_pad` / `pin_pad` bytes, so a batch of a
 * larger image reuses a block instead of reallocating. NULL or an empty path: defaults.
 *
 * Handles (code streams, images) are kept across calls and reused, as nvImageCodec
 * allows. Called through ctypes, which releases the GIL for the whole call. */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <dlfcn.h>
#include <pthread.h>

#include <nvimgcodec.h>

/* the CUDA runtime calls the pools need, found in the library the process loaded */
typedef int (*malloc_async_f)(void**, size_t, cudaStream_t);
typedef int (*free_async_f)(void*, cudaStream_t);
typedef int (*host_alloc_f)(void**, size_t, unsigned int);
typedef int (*free_host_f)(void*);
typedef int (*event_create_f)(void**, unsigned int);
typedef int (*event_record_f)(void*, cudaStream_t);
typedef int (*event_sync_f)(void*);
typedef int (*event_destroy_f)(void*);
typedef int (*default_pool_f)(void**, int);
typedef int (*pool_set_f)(void*, int, void*);

#define PINNED_KEPT 64 /* pinned blocks kept for reuse at most */

typedef struct {
    void* ptr;
    size_t size;
    void* event; /* recorded on the freeing stream; NULL: free for any stream now */
    int busy;
} pinned_block;

typedef struct {
    void* dl;
    malloc_async_f malloc_async;
    free_async_f free_async;
    host_alloc_f host_alloc;
    free_host_f free_host;
    event_create_f event_create;
    event_record_f event_record;
    event_sync_f event_sync;
    event_destroy_f event_destroy;
    pthread_mutex_t lock;
    pinned_block blocks[PINNED_KEPT];
    nvimgcodecDeviceAllocator_t dev;
    nvimgcodecPinnedAllocator_t pin;
} pools_t;

static int pool_dev_malloc(void* ctx, void** ptr, size_t size, cudaStream_t stream) {
    pools_t* p = (pools_t*)ctx;
    return p->malloc_async(ptr, size, stream);
}

static int pool_dev_free(void* ctx, void* ptr, size_t size, cudaStream_t stream) {
    (void)size;
    pools_t* p = (pools_t*)ctx;
    return p->free_async(ptr, stream);
}

static int pool_pin_malloc(void* ctx, void** ptr, size_t size, cudaStream_t stream) {
    (void)stream;
    pools_t* p = (pools_t*)ctx;
    pinned_block* best = NULL;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < PINNED_KEPT; i++) {
        pinned_block* b = &p->blocks[i];
        if (b->ptr && !b->busy && b->size >= size && (!best || b->size < best->size)) best = b;
    }
    if (best) best->busy = 1;
    pthread_mutex_unlock(&p->lock);
    if (best) {
        if (best->event) p->event_sync(best->event); /* its last user's copies are done */
        *ptr = best->ptr;
        return 0;
    }
    int rc = p->host_alloc(ptr, size, 0);
    if (rc != 0) return rc;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < PINNED_KEPT; i++) {
        if (!p->blocks[i].ptr) {
            p->blocks[i].ptr = *ptr;
            p->blocks[i].size = size;
            p->blocks[i].busy = 1;
            break;
        }
    }
    pthread_mutex_unlock(&p->lock); /* a block past PINNED_KEPT is freed for real later */
    return 0;
}

static int pool_pin_free(void* ctx, void* ptr, size_t size, cudaStream_t stream) {
    (void)size;
    pools_t* p = (pools_t*)ctx;
    pthread_mutex_lock(&p->lock);
    for (int i = 0; i < PINNED_KEPT; i++) {
        pinned_block* b = &p->blocks[i];
        if (b->ptr == ptr) {
            if (!b->event && p->event_create(&b->event, 2 /* cudaEventDisableTiming */) != 0)
                b->event = NULL; /* a failed call's output is not an event */
            if (b->event && p->event_record(b->event, stream) == 0) {
                b->busy = 0;
                pthread_mutex_unlock(&p->lock);
                return 0;
            }
            /* nothing marks where `stream` is past the block: its next user could be
             * handed it while this stream still copies from it. Not kept: freed below
             * (cudaFreeHost waits for the device), its slot free for a new block. */
            if (b->event) p->event_destroy(b->event);
            b->event = NULL;
            b->ptr = NULL;
            b->size = 0;
            b->busy = 0;
            break;
        }
    }
    pthread_mutex_unlock(&p->lock);
    return p->free_host(ptr); /* not kept: nvjpeg frees it after its stream is done */
}

static void pools_close(pools_t* p) {
    if (!p) return;
    for (int i = 0; i < PINNED_KEPT; i++) {
        pinned_block* b = &p->blocks[i];
        if (b->event) {
            p->event_sync(b->event);
            p->event_destroy(b->event);
        }
        if (b->ptr) p->free_host(b->ptr);
    }
    pthread_mutex_destroy(&p->lock);
    if (p->dl) dlclose(p->dl);
    free(p);
}

/* The pools on `cudart`, or NULL (the defaults) where it or a call is missing. */
static pools_t* pools_open(const char* cudart, int device_id, int64_t dev_pad, int64_t pin_pad) {
    if (!cudart || !*cudart) return NULL;
    pools_t* p = (pools_t*)calloc(1, sizeof(pools_t));
    if (!p) return NULL;
    p->dl = dlopen(cudart, RTLD_NOW | RTLD_LOCAL);
    if (!p->dl) {
        free(p);
        return NULL;
    }
    p->malloc_async = (malloc_async_f)dlsym(p->dl, "cudaMallocAsync");
    p->free_async = (free_async_f)dlsym(p->dl, "cudaFreeAsync");
    p->host_alloc = (host_alloc_f)dlsym(p->dl, "cudaHostAlloc");
    p->free_host = (free_host_f)dlsym(p->dl, "cudaFreeHost");
    p->event_create = (event_create_f)dlsym(p->dl, "cudaEventCreateWithFlags");
    p->event_record = (event_record_f)dlsym(p->dl, "cudaEventRecord");
    p->event_sync = (event_sync_f)dlsym(p->dl, "cudaEventSynchronize");
    p->event_destroy = (event_destroy_f)dlsym(p->dl, "cudaEventDestroy");
    default_pool_f default_pool = (default_pool_f)dlsym(p->dl, "cudaDeviceGetDefaultMemPool");
    pool_set_f pool_set = (pool_set_f)dlsym(p->dl, "cudaMemPoolSetAttribute");
    if (!p->malloc_async || !p->free_async || !p->host_alloc || !p->free_host ||
        !p->event_create || !p->event_record || !p->event_sync || !p->event_destroy) {
        dlclose(p->dl);
        free(p);
        return NULL;
    }
    if (default_pool && pool_set && device_id >= 0) {
        void* pool = NULL; /* keep what is freed in the pool: no cudaFree in the loop */
        uint64_t keep = UINT64_MAX;
        if (default_pool(&pool, device_id) == 0 && pool)
            pool_set(pool, 4 /* cudaMemPoolAttrReleaseThreshold */, &keep);
    }
    pthread_mutex_init(&p->lock, NULL);
    p->dev.struct_type = NVIMGCODEC_STRUCTURE_TYPE_DEVICE_ALLOCATOR;
    p->dev.struct_size = sizeof(nvimgcodecDeviceAllocator_t);
    p->dev.device_malloc = pool_dev_malloc;
    p->dev.device_free = pool_dev_free;
    p->dev.device_ctx = p;
    p->dev.device_mem_padding = (size_t)(dev_pad > 0 ? dev_pad : 0);
    p->pin.struct_type = NVIMGCODEC_STRUCTURE_TYPE_PINNED_ALLOCATOR;
    p->pin.struct_size = sizeof(nvimgcodecPinnedAllocator_t);
    p->pin.pinned_malloc = pool_pin_malloc;
    p->pin.pinned_free = pool_pin_free;
    p->pin.pinned_ctx = p;
    p->pin.pinned_mem_padding = (size_t)(pin_pad > 0 ? pin_pad : 0);
    return p;
}

typedef struct {
    nvimgcodecInstance_t instance;
    nvimgcodecDecoder_t decoder;
    nvimgcodecCodeStream_t* streams;
    nvimgcodecCodeStream_t* subs; /* the boxes' views of streams */
    nvimgcodecImage_t* images;
    int cap;
    int host; /* 1: outputs in host memory (the CPU backend) */
    pools_t* pools; /* NULL: nvImageCodec's default allocations */
} nvb_t;

void nvb_close(void* handle);

void* nvb_open(int device_id, int backend_mask, float hw_load, int cap, int threads,
               const char* options, const char* cudart, int64_t dev_pad, int64_t pin_pad,
               int pre_init, int* err) {
    nvb_t* h = (nvb_t*)calloc(1, sizeof(nvb_t));
    if (!h || cap < 1) {
        free(h);
        *err = -1;
        return NULL;
    }
    nvimgcodecInstanceCreateInfo_t ci;
    memset(&ci, 0, sizeof(ci));
    ci.struct_type = NVIMGCODEC_STRUCTURE_TYPE_INSTANCE_CREATE_INFO;
    ci.struct_size = sizeof(ci);
    ci.load_builtin_modules = 1;
    ci.load_extension_modules = 1;
    nvimgcodecStatus_t s = nvimgcodecInstanceCreate(&h->instance, &ci);
    if (s != NVIMGCODEC_STATUS_SUCCESS) {
        free(h);
        *err = -100 - (int)s;
        return NULL;
    }
    nvimgcodecBackend_t backends[3];
    int nb = 0;
    memset(backends, 0, sizeof(backends));
    /* bit 1: the hardware engines; bit 2: the CUDA decoder; bit 4: the CPU */
    int kinds[3] = {NVIMGCODEC_BACKEND_KIND_HW_GPU_ONLY, NVIMGCODEC_BACKEND_KIND_HYBRID_CPU_GPU,
                    NVIMGCODEC_BACKEND_KIND_CPU_ONLY};
    for (int b = 0; b < 3; b++) {
        if (!(backend_mask & (1 << b))) continue;
        backends[nb].struct_type = NVIMGCODEC_STRUCTURE_TYPE_BACKEND;
        backends[nb].struct_size = sizeof(nvimgcodecBackend_t);
        backends[nb].kind = (nvimgcodecBackendKind_t)kinds[b];
        backends[nb].params.struct_type = NVIMGCODEC_STRUCTURE_TYPE_BACKEND_PARAMS;
        backends[nb].params.struct_size = sizeof(nvimgcodecBackendParams_t);
        backends[nb].params.load_hint = (b == 0) ? hw_load : 1.0f;
        /* the engines' share: adaptive from all of it (1.0), else fixed as DALI's
           hw_decoder_load, the CUDA decoder taking the rest */
        backends[nb].params.load_hint_policy =
            (b == 0 && hw_load >= 1.0f) ? NVIMGCODEC_LOAD_HINT_POLICY_ADAPTIVE_MINIMIZE_IDLE_TIME
                                        : NVIMGCODEC_LOAD_HINT_POLICY_FIXED;
        nb++;
    }
    h->host = (backend_mask == 4);
    if (!h->host) h->pools = pools_open(cudart, device_id, dev_pad, pin_pad);
    nvimgcodecExecutionParams_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.struct_type = NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS;
    ep.struct_size = sizeof(ep);
    ep.max_num_cpu_threads = threads;
    ep.device_id = h->host ? NVIMGCODEC_DEVICE_CPU_ONLY : device_id;
    ep.num_backends = nb;
    ep.backends = backends;
    ep.pre_init = pre_init;
    if (h->pools) {
        ep.device_allocator = &h->pools->dev;
        ep.pinned_allocator = &h->pools->pin;
    }
    s = nvimgcodecDecoderCreate(h->instance, &h->decoder, &ep, options);
    if (s != NVIMGCODEC_STATUS_SUCCESS || !h->decoder) {
        nvb_close(h);
        *err = -100 - (int)s;
        return NULL;
    }
    h->streams = (nvimgcodecCodeStream_t*)calloc((size_t)cap, sizeof(nvimgcodecCodeStream_t));
    h->subs = (nvimgcodecCodeStream_t*)calloc((size_t)cap, sizeof(nvimgcodecCodeStream_t));
    h->images = (nvimgcodecImage_t*)calloc((size_t)cap, sizeof(nvimgcodecImage_t));
    if (!h->streams || !h->subs || !h->images) {
        nvb_close(h);
        *err = -1;
        return NULL;
    }
    h->cap = cap;
    *err = 0;
    return h;
}

int nvb_decode(void* handle, int n, const uint64_t* ptrs, const int64_t* lengths,
               const int64_t* expect_hw, const int64_t* boxes, uint64_t buffer,
               const int64_t* offsets,
               const int64_t* pitches, void* cuda_stream, int32_t* status, int64_t* got_hw) {
    nvb_t* h = (nvb_t*)handle;
    if (!h || n < 0 || n > h->cap) return -1;
    if (n == 0) return 0;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        status[i] = 0;
        got_hw[2 * i] = got_hw[2 * i + 1] = -1;
        nvimgcodecStatus_t s = nvimgcodecCodeStreamCreateFromHostMem(
            h->instance, &h->streams[i], (const unsigned char*)(uintptr_t)ptrs[i],
            (size_t)lengths[i], NULL);
        if (s != NVIMGCODEC_STATUS_SUCCESS) {
            status[i] = -1;
            bad = 1;
            continue;
        }
        nvimgcodecImageInfo_t info;
        memset(&info, 0, sizeof(info));
        info.struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO;
        info.struct_size = sizeof(info);
        s = nvimgcodecCodeStreamGetImageInfo(h->streams[i], &info);
        if (s != NVIMGCODEC_STATUS_SUCCESS) {
            status[i] = -1;
            bad = 1;
            continue;
        }
        got_hw[2 * i] = info.plane_info[0].height;
        got_hw[2 * i + 1] = info.plane_info[0].width;
        if (got_hw[2 * i] != expect_hw[2 * i] || got_hw[2 * i + 1] != expect_hw[2 * i + 1]) {
            status[i] = -2;
            bad = 1;
        }
    }
    if (bad) return 0; /* nothing decoded: the caller names the first bad image */
    if (boxes) {
        for (int i = 0; i < n; i++) {
            const int64_t* b = boxes + 4 * i; /* top, left, height, width */
            if (b[0] < 0 || b[1] < 0 || b[2] < 1 || b[3] < 1 || b[0] + b[2] > expect_hw[2 * i] ||
                b[1] + b[3] > expect_hw[2 * i + 1])
                return -2;
            nvimgcodecCodeStreamView_t view;
            memset(&view, 0, sizeof(view));
            view.struct_type = NVIMGCODEC_STRUCTURE_TYPE_CODE_STREAM_VIEW;
            view.struct_size = sizeof(view);
            view.region.struct_type = NVIMGCODEC_STRUCTURE_TYPE_REGION;
            view.region.struct_size = sizeof(nvimgcodecRegion_t);
            view.region.ndim = 2;
            view.region.start[0] = (int)b[0];
            view.region.start[1] = (int)b[1];
            view.region.end[0] = (int)(b[0] + b[2]);
            view.region.end[1] = (int)(b[1] + b[3]);
            nvimgcodecStatus_t s =
                nvimgcodecCodeStreamGetSubCodeStream(h->streams[i], &h->subs[i], &view);
            if (s != NVIMGCODEC_STATUS_SUCCESS) return -100 - (int)s;
        }
    }
    for (int i = 0; i < n; i++) {
        uint32_t hh = (uint32_t)(boxes ? boxes[4 * i + 2] : expect_hw[2 * i]);
        uint32_t ww = (uint32_t)(boxes ? boxes[4 * i + 3] : expect_hw[2 * i + 1]);
        size_t pitch = (size_t)pitches[i];
        nvimgcodecImageInfo_t out;
        memset(&out, 0, sizeof(out));
        out.struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_INFO;
        out.struct_size = sizeof(out);
        out.color_spec = NVIMGCODEC_COLORSPEC_SRGB;
        out.chroma_subsampling = NVIMGCODEC_SAMPLING_NONE;
        out.sample_format = NVIMGCODEC_SAMPLEFORMAT_P_RGB;
        out.orientation.struct_type = NVIMGCODEC_STRUCTURE_TYPE_ORIENTATION;
        out.orientation.struct_size = sizeof(nvimgcodecOrientation_t);
        out.num_planes = 3;
        for (int p = 0; p < 3; p++) {
            out.plane_info[p].struct_type = NVIMGCODEC_STRUCTURE_TYPE_IMAGE_PLANE_INFO;
            out.plane_info[p].struct_size = sizeof(nvimgcodecImagePlaneInfo_t);
            out.plane_info[p].width = ww;
            out.plane_info[p].height = hh;
            out.plane_info[p].row_stride = pitch;
            out.plane_info[p].num_channels = 1;
            out.plane_info[p].sample_type = NVIMGCODEC_SAMPLE_DATA_TYPE_UINT8;
            out.plane_info[p].precision = 8;
        }
        out.buffer = (void*)(uintptr_t)(buffer + (uint64_t)offsets[i]);
        out.buffer_kind = h->host ? NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_HOST
                                  : NVIMGCODEC_IMAGE_BUFFER_KIND_STRIDED_DEVICE;
        out.cuda_stream = (cudaStream_t)cuda_stream;
        nvimgcodecStatus_t s = nvimgcodecImageCreate(h->instance, &h->images[i], &out);
        if (s != NVIMGCODEC_STATUS_SUCCESS) return -100 - (int)s;
    }
    nvimgcodecDecodeParams_t dp;
    memset(&dp, 0, sizeof(dp));
    dp.struct_type = NVIMGCODEC_STRUCTURE_TYPE_DECODE_PARAMS;
    dp.struct_size = sizeof(dp);
    dp.apply_exif_orientation = 0;
    nvimgcodecFuture_t future = NULL;
    nvimgcodecStatus_t s = nvimgcodecDecoderDecode(h->decoder, boxes ? h->subs : h->streams,
                                                   h->images, n, &dp, &future);
    if (s != NVIMGCODEC_STATUS_SUCCESS) {
        if (future) nvimgcodecFutureDestroy(future);
        return -100 - (int)s;
    }
    nvimgcodecFutureWaitForAll(future);
    nvimgcodecProcessingStatus_t* ps =
        (nvimgcodecProcessingStatus_t*)malloc((size_t)n * sizeof(nvimgcodecProcessingStatus_t));
    size_t got = (size_t)n;
    if (!ps) {
        nvimgcodecFutureDestroy(future);
        return -1;
    }
    s = nvimgcodecFutureGetProcessingStatus(future, ps, &got);
    for (int i = 0; i < n; i++)
        status[i] = (s == NVIMGCODEC_STATUS_SUCCESS && (size_t)i < got &&
                     ps[i] == NVIMGCODEC_PROCESSING_STATUS_SUCCESS)
                        ? 1
                        : -3;
    free(ps);
    nvimgcodecFutureDestroy(future);
    return s == NVIMGCODEC_STATUS_SUCCESS ? 0 : -100 - (int)s;
}

/* The pools alone, for the CPU tests (a stand-in runtime library with the same calls):
 * open, take and give back pinned and device blocks, close. */
void* nvb_pools_open(const char* cudart, int64_t dev_pad, int64_t pin_pad) {
    return pools_open(cudart, -1, dev_pad, pin_pad);
}
int nvb_pools_pinned(void* pools, void** ptr, size_t size, int give_back) {
    return give_back ? pool_pin_free(pools, *ptr, size, NULL)
                     : pool_pin_malloc(pools, ptr, size, NULL);
}
int nvb_pools_device(void* pools, void** ptr, size_t size, int give_back) {
    return give_back ? pool_dev_free(pools, *ptr, size, NULL)
                     : pool_dev_malloc(pools, ptr, size, NULL);
}
void nvb_pools_close(void* pools) { pools_close((pools_t*)pools); }

int nvb_pooled(void* handle) { return handle && ((nvb_t*)handle)->pools ? 1 : 0; }

void nvb_close(void* handle) {
    nvb_t* h = (nvb_t*)handle;
    if (!h) return;
    for (int i = 0; i < h->cap; i++) {
        if (h->images && h->images[i]) nvimgcodecImageDestroy(h->images[i]);
        if (h->subs && h->subs[i]) nvimgcodecCodeStreamDestroy(h->subs[i]);
        if (h->streams && h->streams[i]) nvimgcodecCodeStreamDestroy(h->streams[i]);
    }
    free(h->images);
    free(h->subs);
    free(h->streams);
    if (h->decoder) nvimgcodecDecoderDestroy(h->decoder);
    if (h->instance) nvimgcodecInstanceDestroy(h->instance);
    pools_close(h->pools); /* after the decoder: it frees into them */
    free(h);
}
