// The HOG people detector, called from hog.go. gocv v0.31's
// HOGDefaultPeopleDetector wraps a temporary std::vector without copying
// it (the detector's coefficients are freed memory by the time
// SetSVMDetector reads them: every frame, even a blank one, then gets the
// same bogus box), and its DetectMultiScale returns no weights; this shim
// builds the descriptor with OpenCV's own coefficients and returns the
// weights.
#ifndef MDAG_HOG_H
#define MDAG_HOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef void *MdagHOG;

// mdag_hog_new returns a descriptor with the default people detector, or
// NULL (with *err, malloc'ed, saying why).
MdagHOG mdag_hog_new(char **err);
void mdag_hog_free(MdagHOG h);

// mdag_hog_detect runs detectMultiScale on the w x h BGR image bgr
// (stride w*3), downscaled first to width dw (area interpolation) when
// 0 < dw < w. It returns the number of people found and sets *rects
// (x, y, width, height per person, in the detection image's coordinates)
// and *weights (the SVM margin per person), both malloc'ed (NULL when
// none); on an OpenCV error it returns -1 and sets *err (malloc'ed).
// *dh is the detection image's height.
int mdag_hog_detect(MdagHOG h, const unsigned char *bgr, int w, int hgt, int dw, double hit, double scale,
                    double final_threshold, int *dh, int **rects, double **weights, char **err);

#ifdef __cplusplus
}
#endif

#endif
