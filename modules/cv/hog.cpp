#include "hog.h"

#include <cstdlib>
#include <cstring>
#include <exception>
#include <opencv2/imgproc.hpp>
#include <opencv2/objdetect.hpp>
#include <vector>

static char *dupError(const char *what) {
    size_t n = std::strlen(what);
    char *s = static_cast<char *>(std::malloc(n + 1));
    if (s != NULL) {
        std::memcpy(s, what, n + 1);
    }
    return s;
}

MdagHOG mdag_hog_new(char **err) {
    *err = NULL;
    try {
        cv::HOGDescriptor *h = new cv::HOGDescriptor();
        h->setSVMDetector(cv::HOGDescriptor::getDefaultPeopleDetector());
        return h;
    } catch (const std::exception &e) {
        *err = dupError(e.what());
    }
    return NULL;
}

void mdag_hog_free(MdagHOG h) { delete static_cast<cv::HOGDescriptor *>(h); }

int mdag_hog_detect(MdagHOG h, const unsigned char *bgr, int w, int hgt, int dw, double hit, double scale,
                    double final_threshold, int *dh, int **rects, double **weights, char **err) {
    *rects = NULL;
    *weights = NULL;
    *err = NULL;
    *dh = hgt;
    try {
        cv::Mat src(hgt, w, CV_8UC3, const_cast<unsigned char *>(bgr));
        cv::Mat img = src;
        if (dw > 0 && dw < w) {
            int sh = (int)(((long long)hgt * dw + w / 2) / w);
            if (sh < 1) {
                sh = 1;
            }
            cv::resize(src, img, cv::Size(dw, sh), 0, 0, cv::INTER_AREA);
            *dh = sh;
        }
        cv::HOGDescriptor *d = static_cast<cv::HOGDescriptor *>(h);
        if (img.cols < d->winSize.width || img.rows < d->winSize.height) {
            return 0;
        }
        std::vector<cv::Rect> found;
        std::vector<double> ws;
        d->detectMultiScale(img, found, ws, hit, cv::Size(8, 8), cv::Size(8, 8), scale, final_threshold, false);
        if (found.empty()) {
            return 0;
        }
        int n = (int)found.size();
        *rects = static_cast<int *>(std::malloc(sizeof(int) * 4 * n));
        *weights = static_cast<double *>(std::malloc(sizeof(double) * n));
        if (*rects == NULL || *weights == NULL) {
            std::free(*rects);
            std::free(*weights);
            *rects = NULL;
            *weights = NULL;
            *err = dupError("out of memory");
            return -1;
        }
        for (int i = 0; i < n; i++) {
            (*rects)[4 * i] = found[i].x;
            (*rects)[4 * i + 1] = found[i].y;
            (*rects)[4 * i + 2] = found[i].width;
            (*rects)[4 * i + 3] = found[i].height;
            (*weights)[i] = i < (int)ws.size() ? ws[i] : 0;
        }
        return n;
    } catch (const std::exception &e) {
        *err = dupError(e.what());
    }
    return -1;
}
