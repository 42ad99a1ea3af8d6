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
 * nvb_close  frees everything.
 *
 * Handles (code streams, images) are kept across calls and reused, as nvImageCodec
 * allows. Called through ctypes, which releases the GIL for the whole call. */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <nvimgcodec.h>

typedef struct {
    nvimgcodecInstance_t instance;
    nvimgcodecDecoder_t decoder;
    nvimgcodecCodeStream_t* streams;
    nvimgcodecCodeStream_t* subs; /* the boxes' views of streams */
    nvimgcodecImage_t* images;
    int cap;
    int host; /* 1: outputs in host memory (the CPU backend) */
} nvb_t;

void nvb_close(void* handle);

void* nvb_open(int device_id, int backend_mask, float hw_load, int cap, int threads,
               const char* options, int* err) {
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
    nvimgcodecExecutionParams_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.struct_type = NVIMGCODEC_STRUCTURE_TYPE_EXECUTION_PARAMS;
    ep.struct_size = sizeof(ep);
    ep.max_num_cpu_threads = threads;
    ep.device_id = h->host ? NVIMGCODEC_DEVICE_CPU_ONLY : device_id;
    ep.num_backends = nb;
    ep.backends = backends;
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
    free(h);
}
