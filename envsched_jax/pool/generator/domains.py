"""The business-domain vocabulary of the synthetic pool generator.

Every domain has the same abstract shape, which is what lets task templates repeat across
environments: *entities* (patients, guests, containers) move through a three-step lifecycle
(pending -> active -> closed) and are assigned to *slots* (beds, rooms, racks) of a matching
*category*, subject to capacity; *actors* (staff with roles) may be authorised to delete entities.
Only the words differ: that is exactly the concrete-versus-abstract split of the paper's
dual-relation graph (same topology, different tool, field and entity names).
"""

from __future__ import annotations

import dataclasses
from typing import Union

AttrSpec = Union[tuple[int, int], tuple[str, ...]]  # (lo, hi) integer range, or allowed strings
PERSON = "person"


@dataclasses.dataclass(frozen=True)
class Domain:
    key: str
    title: str
    entity: str
    slot: str
    category: str
    categories: tuple[str, ...]
    statuses: tuple[str, str, str]          # pending, active, closed
    verbs: tuple[str, str]                  # activate (pending->active), close (active->closed)
    create_verb: str
    delete_verb: str
    actor: str
    roles: tuple[str, str, str]             # ascending authority
    entity_attrs: tuple[tuple[str, AttrSpec], ...]
    slot_attr: tuple[str, AttrSpec]
    capacity: tuple[int, int]
    names: str | tuple[str, ...]            # PERSON, or nouns for item names

    @property
    def entity_plural(self) -> str:
        return plural(self.entity)

    @property
    def slot_plural(self) -> str:
        return plural(self.slot)

    @property
    def actor_plural(self) -> str:
        return plural(self.actor)


_IRREGULAR = {"child": "children", "person": "people", "staff": "staff", "series": "series"}


def plural(word: str) -> str:
    """English plural of the last ``_``-separated part of an identifier."""
    head, _, last = word.rpartition("_")
    if last in _IRREGULAR:
        out = _IRREGULAR[last]
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        out = last[:-1] + "ies"
    elif last.endswith(("s", "x", "ch", "sh", "z")):
        out = last + "es"
    else:
        out = last + "s"
    return f"{head}_{out}" if head else out


def human(identifier: str) -> str:
    return identifier.replace("_", " ")


def _d(key, title, entity, slot, category, categories, statuses, verbs, create_delete, actor,
       roles, entity_attrs, slot_attr, capacity, names=PERSON) -> Domain:
    return Domain(key, title, entity, slot, category, tuple(categories), tuple(statuses),
                  tuple(verbs), create_delete[0], create_delete[1], actor, tuple(roles),
                  tuple(entity_attrs.items()), slot_attr, capacity, names)


LEVELS = ("bronze", "silver", "gold")

DOMAINS: tuple[Domain, ...] = (
    _d("clinic_beds", "Clinic Bed Management", "patient", "bed", "ward",
       ("cardiology", "oncology", "pediatrics", "orthopedics"),
       ("waiting", "admitted", "discharged"), ("admit", "discharge"), ("register", "remove"),
       "staff_member", ("nurse", "charge_nurse", "ward_manager"),
       {"age": (18, 95), "insurance_plan": ("basic", "standard", "premium"),
        "blood_type": ("A", "B", "AB", "O")}, ("floor", (1, 6)), (1, 1)),
    _d("library_loans", "Library Loan Desk", "book", "reader", "collection",
       ("fiction", "history", "science", "children"),
       ("cataloguing", "circulating", "withdrawn"), ("shelve", "withdraw"), ("catalogue", "purge"),
       "librarian", ("assistant", "librarian", "head_librarian"),
       {"publication_year": (1950, 2025), "format": ("hardcover", "paperback", "large_print"),
        "pages": (80, 900)}, ("membership_years", (0, 30)), (1, 3),
       ("Atlas", "Chronicle", "Compendium", "Almanac", "Treatise", "Primer", "Anthology")),
    _d("warehouse_stock", "Warehouse Stock Control", "stock_item", "storage_bin", "storage_class",
       ("dry", "chilled", "frozen", "hazardous"),
       ("inbound", "stored", "dispatched"), ("receive", "dispatch"), ("log", "scrap"),
       "operator", ("picker", "supervisor", "inventory_manager"),
       {"quantity": (1, 500), "unit": ("box", "pallet", "crate"), "weight_kg": (1, 900)},
       ("aisle", (1, 40)), (1, 4), ("Valve", "Bracket", "Gasket", "Sensor", "Cable", "Panel")),
    _d("hotel_rooms", "Hotel Room Operations", "guest", "room", "room_type",
       ("single", "double", "suite", "family"),
       ("reserved", "checked_in", "checked_out"), ("check_in", "check_out"), ("book", "erase"),
       "clerk", ("receptionist", "duty_manager", "general_manager"),
       {"nights": (1, 14), "loyalty_tier": LEVELS, "party_size": (1, 5)}, ("floor", (1, 12)), (1, 1)),
    _d("car_rental", "Car Rental Counter", "renter", "vehicle", "vehicle_class",
       ("economy", "compact", "suv", "van"),
       ("booked", "on_rent", "returned"), ("release", "settle"), ("open", "delete"),
       "agent", ("counter_agent", "shift_lead", "branch_manager"),
       {"license_years": (1, 50), "insurance_cover": ("none", "partial", "full"),
        "rental_days": (1, 30)}, ("mileage_k", (1, 200)), (1, 1)),
    _d("course_enrollment", "Course Enrollment Office", "student", "course_section", "department",
       ("mathematics", "biology", "literature", "engineering"),
       ("applied", "enrolled", "withdrawn"), ("enroll", "withdraw"), ("admit", "expunge"),
       "registrar", ("advisor", "registrar", "dean"),
       {"year_of_study": (1, 5), "credits": (0, 180), "funding": ("self", "grant", "loan")},
       ("room_number", (100, 450)), (2, 4)),
    _d("consultant_staffing", "Consultant Staffing Desk", "consultant", "project", "practice_area",
       ("strategy", "technology", "operations", "finance"),
       ("onboarding", "engaged", "released"), ("activate", "release"), ("hire", "offboard"),
       "manager", ("coordinator", "engagement_manager", "partner"),
       {"seniority": ("analyst", "associate", "principal"), "day_rate": (400, 2500),
        "years_experience": (0, 30)}, ("budget_k", (50, 900)), (1, 3)),
    _d("parking_permits", "Parking Permit Office", "driver", "parking_space", "zone",
       ("north", "south", "east", "west"),
       ("applied", "permitted", "revoked"), ("approve", "revoke"), ("enlist", "strike"),
       "officer", ("attendant", "officer", "chief_officer"),
       {"vehicle_length_m": (3, 7), "plate_region": ("local", "national", "foreign"),
        "permit_months": (1, 12)}, ("level", (0, 5)), (1, 1)),
    _d("equipment_checkout", "Lab Equipment Checkout", "instrument", "lab_station", "lab_type",
       ("optics", "chemistry", "electronics", "biology"),
       ("calibrating", "in_service", "decommissioned"), ("commission", "decommission"),
       ("acquire", "dispose"), "technician", ("student_tech", "technician", "lab_director"),
       {"calibration_days": (1, 365), "value_usd": (100, 90000), "fragility": ("low", "medium", "high")},
       ("bench_count", (1, 8)), (1, 2), ("Spectrometer", "Oscilloscope", "Centrifuge", "Microscope", "Pipette")),
    _d("gym_classes", "Gym Class Booking", "gym_member", "fitness_class", "class_type",
       ("yoga", "spin", "boxing", "pilates"),
       ("trial", "active", "cancelled"), ("activate", "cancel"), ("sign_up", "purge"),
       "trainer", ("instructor", "senior_trainer", "gym_manager"),
       {"age": (16, 80), "membership_level": LEVELS, "visits": (0, 300)}, ("duration_min", (30, 90)), (2, 4)),
    _d("restaurant_tables", "Restaurant Table Service", "party", "dining_table", "section",
       ("terrace", "main_hall", "bar", "private_room"),
       ("waitlisted", "seated", "settled"), ("seat", "settle"), ("book", "drop"),
       "host", ("runner", "host", "floor_manager"),
       {"party_size": (1, 10), "occasion": ("none", "birthday", "business"), "allergies": (0, 3)},
       ("chairs", (2, 10)), (1, 1)),
    _d("school_buses", "School Bus Routing", "pupil", "bus_route", "district",
       ("riverside", "hilltop", "old_town", "meadows"),
       ("registered", "riding", "withdrawn"), ("activate", "withdraw"), ("register", "deregister"),
       "dispatcher", ("driver", "dispatcher", "transport_director"),
       {"grade": (1, 12), "stop_number": (1, 40), "needs_assistance": ("no", "yes")},
       ("stops", (5, 30)), (2, 4)),
    _d("vet_kennels", "Veterinary Kennel Board", "pet", "kennel", "size_class",
       ("small", "medium", "large", "giant"),
       ("booked", "boarding", "collected"), ("check_in", "release"), ("enrol", "remove"),
       "vet_staff", ("assistant", "veterinarian", "practice_owner"),
       {"weight_kg": (1, 80), "species": ("dog", "cat", "rabbit"), "age_years": (0, 20)},
       ("run_length_m", (2, 10)), (1, 1)),
    _d("office_desks", "Hot-Desk Allocation", "employee", "desk", "floor_zone",
       ("quiet", "collaboration", "focus", "open_plan"),
       ("invited", "seated", "departed"), ("onboard", "offboard"), ("add", "delete"),
       "facilities_agent", ("coordinator", "facilities_agent", "workplace_lead"),
       {"team_size": (1, 12), "contract": ("permanent", "contractor", "intern"), "badge_level": (1, 4)},
       ("monitors", (0, 3)), (1, 1)),
    _d("conference_talks", "Conference Programme", "talk", "session_slot", "track",
       ("ml", "systems", "security", "design"),
       ("submitted", "accepted", "withdrawn"), ("accept", "withdraw"), ("submit", "discard"),
       "chair", ("reviewer", "track_chair", "general_chair"),
       {"duration_min": (10, 60), "level": ("intro", "intermediate", "advanced"), "speakers": (1, 4)},
       ("room_seats", (40, 600)), (1, 3), ("Keynote", "Tutorial", "Paper", "Panel", "Demo")),
    _d("flight_seats", "Flight Seat Assignment", "passenger", "seat", "cabin_class",
       ("economy", "premium", "business", "first"),
       ("ticketed", "boarded", "disembarked"), ("board", "disembark"), ("book", "offload"),
       "gate_agent", ("gate_agent", "supervisor", "station_manager"),
       {"bags": (0, 4), "meal": ("standard", "vegetarian", "kosher"), "frequent_flyer": LEVELS},
       ("row", (1, 60)), (1, 1)),
    _d("shipping_containers", "Container Yard", "shipment", "container", "cargo_type",
       ("general", "refrigerated", "liquid", "bulk"),
       ("declared", "loaded", "delivered"), ("load", "deliver"), ("declare", "void"),
       "yard_clerk", ("checker", "yard_clerk", "terminal_manager"),
       {"weight_t": (1, 28), "customs": ("pending", "cleared", "inspected"), "pieces": (1, 400)},
       ("stack_tier", (1, 6)), (1, 3), ("Consignment", "Lot", "Freight", "Cargo")),
    _d("daycare_rooms", "Daycare Placement", "child", "classroom", "age_group",
       ("infant", "toddler", "preschool", "kindergarten"),
       ("enquired", "attending", "graduated"), ("start", "graduate"), ("enrol", "unenrol"),
       "educator", ("assistant", "educator", "center_director"),
       {"age_months": (3, 72), "days_per_week": (1, 5), "diet": ("none", "vegetarian", "halal")},
       ("window_count", (1, 6)), (2, 4)),
    _d("datacenter_racks", "Data Center Rack Planning", "server", "rack", "power_class",
       ("low", "standard", "high", "gpu"),
       ("staged", "online", "retired"), ("bring_online", "retire"), ("provision", "wipe"),
       "engineer", ("operator", "engineer", "site_lead"),
       {"rack_units": (1, 8), "watts": (200, 3500), "os": ("linux", "bsd", "windows")},
       ("row_number", (1, 30)), (2, 4), ("Node", "Blade", "Host", "Appliance")),
    _d("compute_jobs", "Compute Job Queue", "job", "compute_node", "gpu_type",
       ("a100", "h100", "l4", "cpu_only"),
       ("queued", "running", "finished"), ("start", "finish"), ("submit", "cancel"),
       "scheduler_admin", ("user_support", "scheduler_admin", "cluster_owner"),
       {"gpus": (1, 8), "priority": ("low", "normal", "urgent"), "hours": (1, 72)},
       ("memory_gb", (64, 2048)), (1, 3), ("Training", "Sweep", "Eval", "Render", "Index")),
    _d("volunteer_shifts", "Volunteer Shift Rota", "volunteer", "shift", "skill",
       ("first_aid", "catering", "logistics", "welcome"),
       ("applied", "active", "retired"), ("activate", "retire"), ("recruit", "remove"),
       "coordinator", ("team_lead", "coordinator", "program_director"),
       {"hours_pledged": (2, 40), "tshirt_size": ("s", "m", "l", "xl"), "age": (16, 85)},
       ("start_hour", (6, 20)), (2, 4)),
    _d("tournament_groups", "Tournament Organizer", "team", "match_group", "division",
       ("junior", "open", "veterans", "women"),
       ("registered", "competing", "eliminated"), ("confirm", "eliminate"), ("register", "disqualify"),
       "official", ("steward", "referee", "tournament_director"),
       {"players": (5, 22), "seed_rank": (1, 64), "kit_color": ("red", "blue", "green", "white")},
       ("pitch_number", (1, 12)), (2, 4), ("Rovers", "United", "Athletic", "Wanderers", "Rangers")),
    _d("marina_berths", "Marina Berth Office", "boat", "berth", "size_class",
       ("dinghy", "cruiser", "yacht", "catamaran"),
       ("expected", "moored", "departed"), ("moor", "depart"), ("register", "strike_off"),
       "harbor_staff", ("dockhand", "harbor_master", "marina_director"),
       {"length_m": (3, 40), "hull": ("fiberglass", "wood", "steel"), "crew": (1, 12)},
       ("depth_m", (2, 9)), (1, 1), ("Osprey", "Mariner", "Seahawk", "Tide", "Breeze")),
    _d("self_storage", "Self-Storage Rentals", "tenant", "storage_unit", "unit_size",
       ("locker", "small", "medium", "large"),
       ("prospective", "renting", "vacated"), ("activate", "vacate"), ("sign", "evict"),
       "site_staff", ("associate", "site_manager", "area_manager"),
       {"months": (1, 24), "climate_control": ("no", "yes"), "insured_value": (0, 20000)},
       ("door_width_cm", (60, 300)), (1, 1)),
    _d("campus_housing", "Campus Housing Office", "resident", "dorm_room", "housing_block",
       ("maple", "cedar", "birch", "willow"),
       ("allocated", "moved_in", "moved_out"), ("move_in", "move_out"), ("admit", "expel"),
       "housing_officer", ("resident_assistant", "housing_officer", "housing_director"),
       {"year": (1, 5), "meal_plan": ("none", "partial", "full"), "quiet_hours": ("no", "yes")},
       ("floor", (0, 8)), (1, 2)),
    _d("carpool_matching", "Commuter Carpool Matching", "commuter", "carpool", "route_area",
       ("downtown", "airport", "university", "industrial"),
       ("signed_up", "riding", "left"), ("match", "drop"), ("enlist", "ban"),
       "mobility_agent", ("helper", "mobility_agent", "program_manager"),
       {"distance_km": (2, 90), "shift": ("early", "day", "late"), "seats_needed": (1, 3)},
       ("seats", (2, 7)), (2, 4)),
    _d("support_tickets", "Customer Support Queues", "ticket", "agent_queue", "skill_group",
       ("billing", "technical", "returns", "accounts"),
       ("new", "in_progress", "resolved"), ("start", "resolve"), ("open", "delete"),
       "support_agent", ("agent", "team_lead", "support_director"),
       {"priority": ("low", "normal", "high"), "age_hours": (0, 240), "replies": (0, 30)},
       ("shift_hours", (4, 12)), (2, 4), ("Refund", "Login", "Outage", "Invoice", "Upgrade")),
    _d("it_incidents", "IT Incident Desk", "incident", "resolver_group", "service",
       ("network", "email", "storage", "identity"),
       ("logged", "assigned", "closed"), ("triage", "close"), ("raise", "purge"),
       "it_staff", ("analyst", "incident_manager", "cio"),
       {"severity": (1, 4), "impact": ("single_user", "team", "company"), "affected_users": (1, 5000)},
       ("on_call_size", (1, 9)), (1, 4), ("Outage", "Latency", "Breach", "Timeout", "Crash")),
    _d("museum_exhibits", "Museum Exhibit Planning", "artwork", "gallery", "period",
       ("ancient", "renaissance", "modern", "contemporary"),
       ("in_storage", "on_display", "deaccessioned"), ("display", "deaccession"),
       ("accession", "destroy"), "curator", ("registrar", "curator", "museum_director"),
       {"year_created": (1400, 2024), "insured_value_k": (10, 90000), "medium": ("oil", "bronze", "marble")},
       ("wall_meters", (10, 120)), (1, 3), ("Portrait", "Landscape", "Bust", "Triptych", "Study")),
    _d("film_festival", "Film Festival Screenings", "film", "screening_slot", "genre",
       ("drama", "documentary", "comedy", "animation"),
       ("submitted", "selected", "rejected"), ("select", "reject"), ("submit", "discard"),
       "programmer", ("screener", "programmer", "festival_director"),
       {"runtime_min": (5, 200), "language": ("english", "french", "spanish", "korean"), "premiere": ("no", "yes")},
       ("screen_seats", (50, 900)), (1, 2), ("Dawn", "Echoes", "Harbor", "Letters", "Silence")),
    _d("farm_paddocks", "Farm Paddock Rotation", "herd_animal", "paddock", "breed_group",
       ("angus", "hereford", "merino", "jersey"),
       ("quarantined", "grazing", "sold"), ("release", "sell"), ("tag", "cull"),
       "farm_hand", ("hand", "herd_manager", "farm_owner"),
       {"weight_kg": (40, 900), "age_months": (1, 120), "vaccinated": ("no", "yes")},
       ("hectares", (1, 60)), (2, 4), ("Clover", "Daisy", "Bramble", "Thistle", "Barley")),
    _d("airport_gates", "Airport Gate Allocation", "flight", "gate", "terminal",
       ("t1", "t2", "t3", "regional"),
       ("scheduled", "at_gate", "departed"), ("dock", "depart"), ("schedule", "scrub"),
       "ops_controller", ("planner", "ops_controller", "ops_director"),
       {"passengers": (20, 450), "aircraft": ("narrowbody", "widebody", "turboprop"), "delay_min": (0, 240)},
       ("jet_bridges", (0, 2)), (1, 1), ("Express", "Shuttle", "Connector", "Redeye")),
    _d("operating_rooms", "Operating Room Scheduling", "surgery", "operating_room", "specialty",
       ("general", "cardiac", "neuro", "orthopedic"),
       ("requested", "scheduled", "completed"), ("schedule", "complete"), ("request", "cancel"),
       "scheduler", ("clerk", "scheduler", "chief_of_surgery"),
       {"duration_min": (30, 600), "urgency": ("elective", "urgent", "emergency"), "team_size": (3, 12)},
       ("suite_number", (1, 20)), (1, 1), ("Bypass", "Arthroscopy", "Resection", "Graft", "Repair")),
    _d("lab_samples", "Biobank Sample Storage", "sample", "freezer", "temperature_class",
       ("minus_20", "minus_80", "liquid_nitrogen", "fridge"),
       ("received", "stored", "consumed"), ("store", "consume"), ("accession", "discard"),
       "lab_manager", ("technician", "lab_manager", "biobank_director"),
       {"volume_ml": (1, 50), "tissue": ("blood", "plasma", "tissue", "saliva"), "aliquots": (1, 12)},
       ("shelves", (2, 12)), (2, 4), ("Cohort", "Batch", "Specimen", "Panel")),
    _d("freight_trucks", "Freight Dispatch", "load", "truck", "cargo_class",
       ("pallets", "tanker", "flatbed", "refrigerated"),
       ("booked", "in_transit", "delivered"), ("dispatch", "deliver"), ("book", "void"),
       "dispatcher", ("clerk", "dispatcher", "fleet_manager"),
       {"weight_t": (1, 40), "distance_km": (10, 3000), "hazmat": ("no", "yes")},
       ("axles", (2, 6)), (1, 2), ("Consignment", "Haul", "Shipment", "Drop")),
    _d("event_venues", "Event Venue Booking", "event", "hall", "event_type",
       ("wedding", "conference", "concert", "exhibition"),
       ("tentative", "confirmed", "cancelled"), ("confirm", "cancel"), ("pencil_in", "erase"),
       "events_staff", ("assistant", "event_planner", "venue_director"),
       {"guests": (10, 900), "catering": ("none", "buffet", "plated"), "hours": (2, 14)},
       ("stage_m2", (0, 200)), (1, 1), ("Gala", "Summit", "Reception", "Showcase", "Festival")),
    _d("elder_care", "Elder Care Home", "care_recipient", "care_team", "care_level",
       ("independent", "assisted", "memory", "nursing"),
       ("assessed", "in_care", "discharged"), ("admit", "discharge"), ("intake", "remove"),
       "care_staff", ("carer", "care_manager", "home_director"),
       {"age": (60, 105), "mobility": ("full", "walker", "wheelchair"), "visits_per_week": (0, 7)},
       ("carers", (2, 8)), (2, 4)),
    _d("software_licenses", "Software License Desk", "user_account", "license_pool", "product_tier",
       ("starter", "pro", "enterprise", "education"),
       ("requested", "licensed", "revoked"), ("grant", "revoke"), ("provision", "deprovision"),
       "it_admin", ("helpdesk", "it_admin", "it_director"),
       {"department_code": (100, 999), "region": ("emea", "amer", "apac"), "devices": (1, 5)},
       ("renewal_month", (1, 12)), (2, 4)),
    _d("clinical_trials", "Clinical Trial Enrollment", "participant", "trial_arm", "condition",
       ("diabetes", "asthma", "migraine", "hypertension"),
       ("screened", "enrolled", "withdrawn"), ("randomize", "withdraw"), ("screen", "exclude"),
       "investigator", ("coordinator", "investigator", "principal_investigator"),
       {"age": (18, 85), "site": ("boston", "lyon", "osaka"), "visits": (0, 20)},
       ("dose_mg", (5, 500)), (2, 4)),
    _d("mentorship_program", "Mentorship Matching", "mentee", "mentor", "field",
       ("software", "design", "finance", "research"),
       ("applied", "matched", "graduated"), ("activate", "graduate"), ("admit", "remove"),
       "program_staff", ("volunteer", "program_officer", "program_director"),
       {"career_years": (0, 15), "goal": ("promotion", "switch", "skills"), "sessions": (0, 24)},
       ("years_mentoring", (1, 30)), (1, 3)),
    _d("tutoring_center", "Tutoring Center", "learner", "tutor_slot", "subject",
       ("algebra", "chemistry", "essay_writing", "physics"),
       ("waitlisted", "tutoring", "finished"), ("begin", "finish"), ("enrol", "drop"),
       "tutor_admin", ("tutor", "tutor_admin", "center_head"),
       {"grade": (5, 12), "sessions_left": (0, 20), "format": ("online", "in_person")},
       ("weekday", (1, 5)), (1, 3)),
    _d("job_placement", "Job Placement Agency", "candidate", "job_opening", "sector",
       ("healthcare", "retail", "logistics", "software"),
       ("sourced", "placed", "archived"), ("place", "archive"), ("source", "blacklist"),
       "recruiter", ("sourcer", "recruiter", "agency_director"),
       {"experience_years": (0, 35), "notice_weeks": (0, 12), "remote": ("no", "hybrid", "yes")},
       ("salary_k", (25, 250)), (1, 2)),
    _d("animal_adoption", "Animal Adoption Center", "animal", "foster_home", "species",
       ("dog", "cat", "rabbit", "bird"),
       ("intake", "fostered", "adopted"), ("foster", "adopt"), ("admit", "transfer_out"),
       "shelter_staff", ("volunteer", "caseworker", "shelter_manager"),
       {"age_years": (0, 18), "temperament": ("calm", "playful", "shy"), "vaccinations": (0, 6)},
       ("yard_m2", (0, 500)), (1, 2), ("Biscuit", "Pepper", "Luna", "Milo", "Hazel")),
    _d("community_garden", "Community Garden Plots", "gardener", "garden_plot", "soil_type",
       ("clay", "loam", "sandy", "raised_bed"),
       ("waitlisted", "growing", "lapsed"), ("activate", "lapse"), ("enlist", "expel"),
       "garden_steward", ("helper", "garden_steward", "board_chair"),
       {"seasons": (0, 20), "water_use": ("low", "medium", "high"), "helpers": (0, 4)},
       ("area_m2", (4, 60)), (1, 2)),
    _d("bike_share", "Bike Share Docking", "bike", "docking_station", "district",
       ("central", "harbor", "campus", "park"),
       ("in_repair", "in_service", "scrapped"), ("deploy", "scrap"), ("enroll", "delete"),
       "fleet_tech", ("mechanic", "fleet_tech", "operations_manager"),
       {"battery_pct": (0, 100), "frame": ("classic", "electric", "cargo"), "rides": (0, 9000)},
       ("docks", (4, 40)), (1, 4), ("Cruiser", "Commuter", "Roadster", "Sprinter")),
    _d("ev_charging", "EV Charging Allocation", "electric_vehicle", "charging_point", "connector",
       ("ccs", "chademo", "type2", "tesla"),
       ("arriving", "charging", "done"), ("plug_in", "unplug"), ("register", "block"),
       "site_operator", ("attendant", "site_operator", "network_manager"),
       {"battery_kwh": (20, 120), "target_pct": (50, 100), "fleet": ("private", "taxi", "delivery")},
       ("max_kw", (7, 350)), (1, 1), ("Volt", "Spark", "Current", "Ion", "Ampere")),
    _d("music_school", "Music School Practice Rooms", "music_student", "practice_room", "instrument",
       ("piano", "strings", "brass", "percussion"),
       ("auditioned", "practicing", "graduated"), ("admit", "graduate"), ("audition", "dismiss"),
       "music_staff", ("accompanist", "teacher", "conservatory_head"),
       {"grade": (1, 8), "lessons_per_week": (1, 5), "ensemble": ("none", "orchestra", "band")},
       ("soundproofing", (1, 5)), (1, 2)),
    _d("print_shop", "Print Shop Jobs", "print_job", "printer", "paper_type",
       ("matte", "gloss", "recycled", "cardstock"),
       ("received", "printing", "collected"), ("start", "collect"), ("accept", "trash"),
       "print_operator", ("trainee", "print_operator", "shop_owner"),
       {"copies": (1, 5000), "color": ("mono", "cmyk"), "pages": (1, 400)},
       ("tray_size", (100, 2000)), (1, 3), ("Flyer", "Brochure", "Poster", "Booklet", "Menu")),
    _d("construction_crews", "Construction Crew Assignment", "worker", "site", "trade",
       ("carpentry", "electrical", "plumbing", "masonry"),
       ("vetted", "on_site", "demobilized"), ("mobilize", "demobilize"), ("hire", "dismiss"),
       "site_manager", ("foreman", "site_manager", "project_director"),
       {"certifications": (0, 6), "hourly_rate": (18, 95), "shift": ("day", "night")},
       ("floors", (1, 40)), (2, 4)),
    _d("pharmacy_dispensing", "Pharmacy Dispensing", "prescription", "dispensing_station", "drug_class",
       ("antibiotic", "analgesic", "controlled", "cardiac"),
       ("received", "filling", "dispensed"), ("start_filling", "dispense"), ("enter", "void"),
       "pharmacist", ("technician", "pharmacist", "chief_pharmacist"),
       {"quantity": (1, 180), "refills": (0, 5), "insurance": ("public", "private", "none")},
       ("counter_number", (1, 9)), (1, 3), ("Amoxicillin", "Ibuprofen", "Atenolol", "Codeine")),
    _d("campground_sites", "Campground Reservations", "camper", "campsite", "site_type",
       ("tent", "rv", "cabin", "group"),
       ("reserved", "camping", "departed"), ("arrive", "depart"), ("reserve", "evict"),
       "ranger", ("volunteer", "ranger", "park_superintendent"),
       {"nights": (1, 14), "party_size": (1, 12), "pets": ("no", "yes")},
       ("shade", (0, 3)), (1, 1)),
    _d("ski_school", "Ski School Lessons", "skier", "ski_lesson", "skill_level",
       ("beginner", "intermediate", "advanced", "freestyle"),
       ("booked", "on_slope", "finished"), ("start", "finish"), ("book", "drop"),
       "ski_instructor", ("instructor", "lead_instructor", "school_director"),
       {"age": (4, 80), "boot_size": (20, 32), "rental": ("none", "skis", "snowboard")},
       ("lift_number", (1, 9)), (2, 4)),
    _d("grant_reviews", "Research Grant Review", "proposal", "review_panel", "discipline",
       ("physics", "biology", "economics", "linguistics"),
       ("submitted", "under_review", "decided"), ("send_to_review", "decide"), ("lodge", "withdraw"),
       "program_officer", ("assistant", "program_officer", "funding_director"),
       {"budget_k": (20, 3000), "years": (1, 5), "team": (1, 15)},
       ("panel_size", (3, 12)), (2, 4), ("Quantum", "Genome", "Markets", "Syntax", "Climate")),
    _d("ferry_deck", "Ferry Deck Loading", "ferry_vehicle", "deck_lane", "vehicle_size",
       ("motorbike", "car", "van", "truck"),
       ("checked_in", "boarded", "unloaded"), ("board", "unload"), ("book", "bump"),
       "deck_officer", ("deckhand", "deck_officer", "captain"),
       {"length_m": (2, 18), "passengers": (1, 9), "hazardous": ("no", "yes")},
       ("lane_length_m", (40, 200)), (2, 4), ("Hatchback", "Camper", "Lorry", "Scooter")),
    _d("recycling_plant", "Recycling Plant Intake", "waste_batch", "processing_line", "material",
       ("plastic", "glass", "paper", "metal"),
       ("weighed", "processing", "recovered"), ("process", "recover"), ("weigh_in", "reject"),
       "plant_operator", ("sorter", "plant_operator", "plant_manager"),
       {"mass_kg": (50, 9000), "contamination_pct": (0, 40), "source": ("household", "commercial")},
       ("throughput_t", (1, 30)), (1, 3), ("Bale", "Load", "Batch", "Drum")),
)

REGIONS: tuple[str, ...] = (
    "North", "South", "East", "West", "Central", "Harbor", "Metro", "Valley", "Coastal", "Lakeside",
    "Uptown", "Riverside", "Summit", "Prairie", "Highland", "Bayside", "Capital", "Frontier",
    "Garden", "Pioneer", "Midland", "Gateway", "Redwood", "Granite", "Sunset", "Aurora",
)

FIRST_NAMES: tuple[str, ...] = (
    "Ada", "Bruno", "Chen", "Dalia", "Elif", "Farah", "Goran", "Hana", "Ines", "Jonas", "Kofi",
    "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor",
    "Wen", "Ximena", "Yusuf", "Zara", "Amara", "Bilal", "Carmen", "Dmitri", "Esther", "Felix",
    "Greta", "Hiro", "Ivy", "Jamal", "Kira", "Luis", "Mina", "Nils",
)
LAST_NAMES: tuple[str, ...] = (
    "Abbott", "Baker", "Castillo", "Dubois", "Eriksen", "Fischer", "Garcia", "Haddad", "Ito",
    "Jensen", "Kowalski", "Laurent", "Moreno", "Nakamura", "Okafor", "Petrov", "Quiroga", "Rossi",
    "Schmidt", "Tanaka", "Usman", "Vargas", "Walsh", "Xu", "Yilmaz", "Zhou", "Adeyemi", "Bianchi",
    "Costa", "Novak",
)
ITEM_WORDS: tuple[str, ...] = (
    "Amber", "Birch", "Cobalt", "Crimson", "Delta", "Ember", "Falcon", "Garnet", "Harbor", "Indigo",
    "Juniper", "Kestrel", "Lumen", "Maple", "Nimbus", "Onyx", "Polar", "Quartz", "Raven", "Sable",
    "Topaz", "Umber", "Vertex", "Willow", "Zephyr",
)
