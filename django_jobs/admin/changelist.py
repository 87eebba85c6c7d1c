"""The count-free changelist: the job table may hold millions of rows, so the jobs list never
counts it. A paginator that fetches one row more than a page says whether a next page exists, and
the changelist orders by the primary key only (UUIDv7, time-ordered).

:class:`SafeChangeList` (every django-jobs changelist) turns the errors a malformed lookup raises
at query time into Django's "invalid lookup" answer instead of a server error.
"""

from __future__ import annotations

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.paginator import EmptyPage, InvalidPage, Page, PageNotAnInteger, Paginator
from django.db import DatabaseError, transaction


class UncountedPage(Page):
    def __init__(self, object_list: list[Any], number: int, paginator: Paginator, has_next: bool):
        super().__init__(object_list, number, paginator)
        self._has_next = has_next

    def has_next(self) -> bool:
        return self._has_next

    def has_previous(self) -> bool:
        return self.number > 1

    def start_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + 1 if self.object_list else 0

    def end_index(self) -> int:
        return (self.number - 1) * self.paginator.per_page + len(self.object_list)


class UncountedPaginator(Paginator):
    """Pages a queryset without ever counting it: a page fetches ``per_page + 1`` rows, the
    extra one only telling whether a next page exists. ``count`` is not the number of rows: it
    is a lower bound, the rows up to the last page fetched (plus one when there are more), so
    nothing that reads it runs a COUNT(*) over millions of jobs."""

    def __init__(self, object_list: Any, per_page: int, orphans: int = 0, allow_empty_first_page: bool = True):
        super().__init__(object_list, per_page, 0, allow_empty_first_page)
        self._seen = 0

    @property
    def count(self) -> int:  # type: ignore[override]
        return self._seen

    @property
    def num_pages(self) -> int:  # type: ignore[override]
        return max(1, -(-self._seen // self.per_page))

    def validate_number(self, number: Any) -> int:
        try:
            number = int(number)
        except (TypeError, ValueError):
            raise PageNotAnInteger("That page number is not an integer") from None
        if number < 1:
            raise EmptyPage("That page number is less than 1")
        return number

    def page(self, number: Any) -> UncountedPage:
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        rows = list(self.object_list[bottom : bottom + self.per_page + 1])
        if not rows and number > 1:
            raise EmptyPage("That page contains no results")
        self._seen = bottom + len(rows)
        return UncountedPage(rows[: self.per_page], number, self, has_next=len(rows) > self.per_page)


#: What a query built from the URL's lookups can raise when it runs: a value the database refuses
#: (NUL in text, an invalid regex), a lookup the backend lacks, a date out of range, a number
#: too large to bind. The admin's own "invalid lookup" answer (a redirect with ?e=1), not a 500.
_BAD_LOOKUP_ERRORS = (DatabaseError, ValueError, OverflowError)


class SafeChangeList(ChangeList):
    """Django's ChangeList, with the errors a malformed lookup raises at query time turned into
    IncorrectLookupParameters. The query runs in a savepoint, so a refused statement does not
    leave the request's transaction aborted (ATOMIC_REQUESTS)."""

    def get_results(self, request):
        try:
            with transaction.atomic(using=self.queryset.db):
                super().get_results(request)
        except IncorrectLookupParameters:
            raise
        except _BAD_LOOKUP_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from None


class JobChangeList(SafeChangeList):
    """Django's ChangeList without its two counts (the filtered and the full result count)."""

    def get_results(self, request):
        paginator = self.model_admin.get_paginator(request, self.queryset, self.list_per_page)
        try:
            with transaction.atomic(using=self.queryset.db):
                page = paginator.page(self.page_num)
        except InvalidPage:
            raise IncorrectLookupParameters from None
        except _BAD_LOOKUP_ERRORS as exc:
            raise IncorrectLookupParameters(exc) from None
        self.page = page
        self.result_list = page.object_list
        self.result_count = paginator.count  # a lower bound; the templates do not show it
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = page.has_other_pages()
        self.paginator = paginator
        self.previous_page_url = self.get_query_string({PAGE_VAR: page.number - 1}) if page.has_previous() else None
        self.next_page_url = self.get_query_string({PAGE_VAR: page.number + 1}) if page.has_next() else None

    def get_ordering(self, request, queryset):
        """By the primary key only, newest first unless asked otherwise: any other order would
        sort the whole (filtered) table, which no index serves."""
        ordering = [o for o in super().get_ordering(request, queryset) if str(o).lstrip("-") in ("pk", "id")]
        return ordering[:1] or ["-pk"]


__all__ = ["JobChangeList", "SafeChangeList", "UncountedPage", "UncountedPaginator"]
